import os
# Does filling api.adhoc_max_keys (2000 here) and waiting for the sweep make the sweep forget an
# exhausted key (3 per 1h), giving its owner a fresh quota?
import json, urllib.request, time, urllib.error
def acq(user, item, limit):
    b = json.dumps({"user": user, "item": item, "limit": limit}).encode()
    return json.loads(urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:18080/v1/acquire', data=b)).read())
L = {"requests": 3, "window": "1h"}; tag = str(time.time())
total = 0
for rnd in range(5):
    got = sum(acq('mallory' + tag, 'export', L)['allowed'] for _ in range(10)); total += got
    refused = sum(not acq(f'spray{tag}_{rnd}_{i}', 'x', {"requests": 5, "window": "1h"})['allowed'] for i in range(2100))
    time.sleep(1.5)
    acq(f'kick{tag}{rnd}', 'x', {"requests": 5, "window": "1h"})   # triggers the sweep
    print(f'round {rnd}: mallory admitted {got} of 10 (limit 3 per hour); spray refused {refused} of 2100')
print('mallory admitted in total', total, 'vs limit 3 per hour')
