import os
# quota_mode: over a per-user quota, a fresh value of a second quota-mode descriptor keeps admitting
import rls, uuid
ch, c = rls.stub()
res = {'same_tenant': 0, 'fresh_tenant': 0, 'user_only': 0}
for i in range(20):
    r = c(rls.request('edge', [rls.descriptor([('q_user', 'mallory1')])]))
    res['user_only'] += rls.overall(r) == 1
for i in range(20):
    r = c(rls.request('edge', [rls.descriptor([('q_user', 'mallory2')]), rls.descriptor([('q_tenant', 't1')])]))
    res['same_tenant'] += rls.overall(r) == 1
for i in range(20):
    r = c(rls.request('edge', [rls.descriptor([('q_user', 'mallory3')]), rls.descriptor([('q_tenant', uuid.uuid4().hex)])]))
    res['fresh_tenant'] += rls.overall(r) == 1
print('OK answers of 20 each (q_user limit 3/min):', res)
