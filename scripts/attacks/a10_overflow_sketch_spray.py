import os
# Keys beyond max_keys_per_rule (1000 here) share a count-min sketch. Spray N keys (hits_addend H each)
# on rule `spray` (5/min, local), then: how many of 60 requests does one attacker key beyond the cap get,
# and how many of 20 fresh legit keys x 1 request are refused?
import rls, sys, time, urllib.request, re
N = int(sys.argv[1]); H = int(sys.argv[2]); tag = sys.argv[3]
ch, c = rls.stub()
t = time.time()
for b in range(0, N, 64):
    c(rls.request('edge', [rls.descriptor([('spray', f'{tag}{i}')], hits=H) for i in range(b, min(b + 64, N))]))
el = time.time() - t
adm = sum(rls.overall(c(rls.request('edge', [rls.descriptor([('spray', f'{tag}attacker')])]))) == 1 for _ in range(60))
legit_ok = sum(rls.overall(c(rls.request('edge', [rls.descriptor([('spray', f'{tag}legit{j}')])]))) == 1 for j in range(20))
m = urllib.request.urlopen('http://127.0.0.1:18090/metrics').read().decode()
nf = [l for l in m.splitlines() if l.startswith('sluice_overflow_noise_floor') and 'spray' in l]
print(f'spray {N} keys x hits {H} in {el:.1f}s; attacker key beyond cap: {adm} of 60 admitted (limit 5); fresh legit keys admitted: {legit_ok} of 20; {nf}')
