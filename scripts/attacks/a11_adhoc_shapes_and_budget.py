import os
# /v1/acquire ad-hoc limits (`limit` in the body): (a) 1,001 new shapes evict a victim's shape,
# resetting its counters; (b) a key spray fills api.adhoc_max_keys (2000 here) so new legit users are refused.
import json, urllib.request, time
def acq(user, item, limit, amount=1):
    b = json.dumps({"user": user, "item": item, "amount": amount, "limit": limit}).encode()
    return json.loads(urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:18080/v1/acquire', data=b)).read())
V = {"requests": 3, "window": "1h"}
tag = str(int(time.time()))
print('victim 4 calls:', [acq('victim' + tag, 'export', V)['allowed'] for _ in range(4)])
for i in range(1001):
    acq('mallory', 'x', {"requests": 1000 + i, "window": "1h"})
print('after 1001 other shapes, victim 4 calls:', [acq('victim' + tag, 'export', V)['allowed'] for _ in range(4)])
# the same, with one user cycling shapes to refill himself: same (user,item), shapes differ by window spelling
print('same key, shape spellings 1h/60m/3600s:', [acq('m2' + tag, 'e', {"requests": 3, "window": w})['allowed'] for w in ['1h'] * 4 + ['60m'] * 4 + ['3600s'] * 4])
# budget: spray new keys under one shape until refused
t = time.time(); n = 0; first_refused = None
for i in range(3000):
    r = acq('spray%s_%d' % (tag, i), 'x', {"requests": 5, "window": "1h"})
    if not r['allowed'] and first_refused is None: first_refused = i
print(f'spray: first refusal at key #{first_refused}; legit new users after spray:', [acq('legit%s_%d' % (tag, j), 'x', {"requests": 5, "window": "1m"})['allowed'] for j in range(5)])
time.sleep(2)
print('legit new users 2 s later:', [acq('legit2%s_%d' % (tag, j), 'x', {"requests": 5, "window": "1m"})['allowed'] for j in range(5)])
print('legit new users in the sprayed shape {5/1h}:', [acq('legit3%s_%d' % (tag, j), 'x', {"requests": 5, "window": "1h"})['allowed'] for j in range(5)])
r = acq('legit4' + tag, 'x', {"requests": 5, "window": "1h"}); print('answer:', r)
m = urllib.request.urlopen('http://127.0.0.1:18090/metrics').read().decode()
print([l for l in m.splitlines() if 'adhoc' in l and not l.startswith('#')])
