import os
# api.adhoc_max_keys lockout: the attacker picks a shape whose keys never go idle
# (1 request per 365 days), fills the budget (2000 here) once, and every NEW ad-hoc key of every
# shape is then refused for as long as those keys stay non-idle.
import json, urllib.request, time
def acq(user, item, limit):
    b = json.dumps({"user": user, "item": item, "limit": limit}).encode()
    return json.loads(urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:18080/v1/acquire', data=b)).read())
tag = str(time.time())
for w in ['365d', '10000d', '1y']:
    try: print('window', w, acq('probe' + w + tag, 'x', {"requests": 1, "window": w}))
    except Exception as e: print('window', w, e)
t = time.time()
ok = sum(acq(f'lock{tag}_{i}', 'x', {"requests": 1, "window": "365d"})['allowed'] for i in range(2100))
print(f'spray: {ok} of 2100 keys taken in {time.time()-t:.1f}s')
for wait in [0, 2, 5, 15, 45]:
    time.sleep(wait)
    res = [acq(f'legit{tag}_{wait}_{j}', 'orders', {"requests": 100, "window": "1m"}) for j in range(10)]
    print(f'+{wait}s: new legit users (100/min shape) admitted {sum(r["allowed"] for r in res)} of 10; sample {res[-1]}')
m = urllib.request.urlopen('http://127.0.0.1:18090/metrics').read().decode()
print([l for l in m.splitlines() if 'adhoc' in l and not l.startswith('#')])
