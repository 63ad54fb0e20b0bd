# POST /reload flood without a token (admin on loopback, no admin_token_file): do counters survive,
# does the API stay fast, what does it cost (CPU, RSS, log lines)?
import http.client, threading, time, os, sys, json, urllib.request
PID = int(open(os.environ.get('ATTACK_LOGS', 'target/attacks') + '/sluice.pid').read())
def rss(): return [l for l in open(f'/proc/{PID}/status') if l.startswith('VmRSS')][0].split()[1]
def cpu(): f = open(f'/proc/{PID}/stat').read().split(); return (int(f[13]) + int(f[14])) / os.sysconf('SC_CLK_TCK')
def acquire(user):
    r = urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:18080/v1/acquire', data=json.dumps({'user': user, 'item': 'x'}).encode()))
    return json.loads(r.read())
for i in range(5): acquire('reloadvictim')
print('victim after 5 of 5:', acquire('reloadvictim'))
loglines0 = sum(1 for _ in open(os.environ.get('ATTACK_LOGS', 'target/attacks') + '/sluice.log'))
N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
codes = {}; lat = []
def worker(n):
    c = http.client.HTTPConnection('127.0.0.1', 18090)
    for i in range(n):
        c.request('POST', '/reload'); r = c.getresponse(); r.read()
        codes[r.status] = codes.get(r.status, 0) + 1
stop = False
def prober():
    while not stop:
        t = time.time(); acquire('probe%d' % len(lat)); lat.append(time.time() - t); time.sleep(0.01)
r0, c0, t0 = rss(), cpu(), time.time()
p = threading.Thread(target=prober); p.start()
ts = [threading.Thread(target=worker, args=(N // 8,)) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
stop = True; p.join()
el = time.time() - t0
lat.sort()
print(f'{N} reloads in {el:.1f}s: codes {codes}; sluice CPU {cpu()-c0:.1f}s; RSS {r0} -> {rss()} kB')
print(f'probe /v1/acquire during flood: n={len(lat)} p50={lat[len(lat)//2]*1000:.1f}ms p99={lat[int(len(lat)*.99)]*1000:.1f}ms max={lat[-1]*1000:.1f}ms')
print('log lines added:', sum(1 for _ in open(os.environ.get('ATTACK_LOGS', 'target/attacks') + '/sluice.log')) - loglines0)
print('victim after flood:', acquire('reloadvictim'))
