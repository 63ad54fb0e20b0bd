# gRPC key derivation and shapes: NUL / unicode / invalid UTF-8 values, many descriptors,
# many entries, huge metadata, and a spray of unknown domains (metrics labels, log lines)
import rls, h2raw, time, os, urllib.request, grpc, uuid
PID = int(open(os.environ.get('ATTACK_LOGS', 'target/attacks') + '/sluice.pid').read())
def rss(): return int([l for l in open(f'/proc/{PID}/status') if l.startswith('VmRSS')][0].split()[1])
def cpu(): f = open(f'/proc/{PID}/stat').read().split(); return (int(f[13]) + int(f[14])) / os.sysconf('SC_CLK_TCK')
ch, c = rls.stub(options=[('grpc.max_send_message_length', 64 << 20), ('grpc.max_metadata_size', 1 << 20)])
def call(req, md=None):
    try: return rls.CODES[rls.overall(c(req, metadata=md, timeout=10))]
    except grpc.RpcError as e: return f'{e.code().name}: {e.details()[:90]}'
def ok_of(values, n=4):
    return [sum(call(rls.request('edge', [rls.descriptor([('user', v)])])) == 'OK' for _ in range(n)) for v in values]
print('user limit 3; OK of 4 for bob / bob\\0 / \\0bob / ｂｏｂ (fullwidth) / BOB / bo\u0301b:',
      ok_of(['bob-n', 'bob-n\0', '\0bob-n', 'ｂｏｂ-n', 'BOB-n', 'bob-n\u0301']))
print('invalid UTF-8 value:', call(rls.request('edge', [rls.descriptor([('user', b'\xff\xfe')])])))
print('NUL in domain:', call(rls.request('edge\0x', [rls.descriptor([('user', 'x')])])))
for n in (63, 64, 65, 1000, 20000):
    d = [rls.descriptor([('spray', f'k{i}')]) for i in range(n)]
    t = time.time(); r = call(rls.request('edge', d)); print(f'{n} descriptors: {r} in {(time.time()-t)*1000:.0f}ms')
for n in (10, 100, 10000):
    t = time.time(); r = call(rls.request('edge', [rls.descriptor([('user', 'e')] * n)])); print(f'{n} entries in one descriptor: {r} in {(time.time()-t)*1000:.0f}ms')
for size in (8000, 60000, 70000, 500000):
    print(f'metadata {size} bytes:', call(rls.request('edge', [rls.descriptor([('user', 'md')])]), md=[('x-junk', 'a' * size)]))
print('metadata 2000 headers of 30 bytes:', call(rls.request('edge', [rls.descriptor([('user', 'md')])]), md=[(f'x-h{i}', 'a' * 20) for i in range(2000)]))
log0 = os.path.getsize(os.environ.get('ATTACK_LOGS', 'target/attacks') + '/sluice.log'); r0 = rss(); c0 = cpu()
t = time.time(); res = {}
for i in range(20000):
    r = call(rls.request(uuid.uuid4().hex, [rls.descriptor([('user', 'x')])]))
    res[r.split(':')[0]] = res.get(r.split(':')[0], 0) + 1
print(f'20000 unknown domains in {time.time()-t:.1f}s: {res}; RSS {r0} -> {rss()} kB; CPU {cpu()-c0:.1f}s; log bytes +{os.path.getsize(os.environ.get("ATTACK_LOGS", "target/attacks") + "/sluice.log")-log0}')
m = urllib.request.urlopen('http://127.0.0.1:18090/metrics').read().decode()
print('metrics lines:', len(m.splitlines()), 'bytes:', len(m), '; lines naming a sprayed domain:', sum(1 for l in m.splitlines() if 'domain="' in l and 'edge' not in l and 'api' not in l))
