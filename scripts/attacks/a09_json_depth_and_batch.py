# JSON API: deep nesting, huge batches, many descriptors per batch entry, numbers, duplicate keys
import json, time, os, urllib.request, urllib.error, threading
PID = int(open(os.environ.get('ATTACK_LOGS', 'target/attacks') + '/sluice.pid').read())
def rss(): return int([l for l in open(f'/proc/{PID}/status') if l.startswith('VmRSS')][0].split()[1])
def cpu(): f = open(f'/proc/{PID}/stat').read().split(); return (int(f[13]) + int(f[14])) / os.sysconf('SC_CLK_TCK')
def post(path, data):
    t = time.time()
    try:
        r = urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:18080' + path, data=data), timeout=60); code = r.status; b = r.read()
    except urllib.error.HTTPError as e: code = e.code; b = e.read()
    return code, b[:150], (time.time() - t) * 1000, len(b)
deep = b'{"user":"a","item":"b","x":' + b'[' * 500000 + b']' * 500000 + b'}'
print('depth 500k in unknown field:', post('/v1/acquire', deep)[:3])
deep2 = b'{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"v"}],"junk":' + b'{"a":' * 100000 + b'1' + b'}' * 100000 + b'}]}'
print('depth 500k in a known field:', post('/v1/acquire', b'{"user":' + b'[' * 500000 + b']' * 500000 + b',"item":"b"}')[:3])
print('depth 100k objects in /json:', post('/json', deep2)[:3])
print('duplicate "user" keys:', post('/v1/acquire', b'{"user":"a","user":"b","item":"x"}')[:3])
print('amount 0:', post('/v1/acquire', b'{"user":"zero","item":"x","amount":0}')[:2], 'amount -1:', post('/v1/acquire', b'{"user":"z","item":"x","amount":-1}')[:2], 'amount 1.5:', post('/v1/acquire', b'{"user":"z","item":"x","amount":1.5}')[:2])
for i in range(5): post('/v1/acquire', b'{"user":"zero2","item":"x"}')
print('amount 0 on exhausted key:', post('/v1/acquire', b'{"user":"zero2","item":"x","amount":0}')[:2])
# biggest batch that fits in 1 MiB
ent = [{"user": "u%d" % i, "item": "b"} for i in range(45000)]
b = json.dumps({"requests": ent}, separators=(',', ':')).encode(); b = b[:0] + b
while len(b) > 1048576: ent = ent[:-500]; b = json.dumps({"requests": ent}, separators=(',', ':')).encode()
r0, c0 = rss(), cpu()
code, head, ms, n = post('/v1/acquire/batch', b)
print(f'batch of {len(ent)} entries ({len(b)} B): {code} in {ms:.0f}ms, answer {n} B; RSS {r0}->{rss()} kB; CPU {cpu()-c0:.2f}s; head {head[:80]}')
# batch entries each with 63 descriptors (amplification of rule checks per byte)
e = {"user": "m", "item": "b", "descriptors": [{"entries": [{"key": "item_total", "value": "v%d" % j}]} for j in range(63)]}
one = len(json.dumps(e, separators=(',', ':')))
k = 1048000 // (one + 1)
b = json.dumps({"requests": [dict(e, user="m%d" % i) for i in range(k)]}, separators=(',', ':')).encode()
c0 = cpu(); code, head, ms, n = post('/v1/acquire/batch', b)
print(f'batch of {k} entries x 63 descriptors ({len(b)} B): {code} in {ms:.0f}ms; CPU {cpu()-c0:.2f}s; {head[:100]}')
# 8 concurrent max batches: does a legit call stall?
big = json.dumps({"requests": [{"user": "p%d" % i, "item": "b"} for i in range(1000)]}, separators=(',', ':')).encode()
lat = []; stop = [False]
def legit():
    while not stop[0]:
        lat.append(post('/v1/acquire', b'{"user":"legit","item":"zz"}')[2]); time.sleep(0.02)
lt = threading.Thread(target=legit); lt.start()
c0 = cpu(); t0 = time.time()
ts = [threading.Thread(target=lambda: [post('/v1/acquire/batch', big) for _ in range(100)]) for _ in range(8)]; [t.start() for t in ts]; [t.join() for t in ts]
stop[0] = True; lt.join(); lat.sort()
print(f'800 batches of 1000 from 8 clients in {time.time()-t0:.1f}s ({800000/(time.time()-t0):.0f} decisions/s), CPU {cpu()-c0:.1f}s; legit p50 {lat[len(lat)//2]:.1f}ms max {lat[-1]:.0f}ms; RSS {rss()} kB')
