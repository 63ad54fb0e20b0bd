import os
# minimal hand-rolled protobuf for envoy.service.ratelimit.v3 (no generated code)
import grpc
def varint(n):
    out = b''
    while True:
        b = n & 0x7f; n >>= 7
        if n: out += bytes([b | 0x80])
        else: return out + bytes([b])
def fld(num, wt, payload):
    if wt == 0: return varint(num << 3) + varint(payload)
    return varint(num << 3 | 2) + varint(len(payload)) + payload
def entry(k, v):
    kb = k.encode() if isinstance(k, str) else k
    vb = v.encode() if isinstance(v, str) else v
    return fld(1, 2, kb) + fld(2, 2, vb)
def descriptor(entries, hits=None):
    b = b''.join(fld(1, 2, entry(k, v)) for k, v in entries)
    if hits is not None: b += fld(3, 2, fld(1, 0, hits) if hits else b'')
    return b
def request(domain, descs, hits=None):
    b = fld(1, 2, domain.encode() if isinstance(domain, str) else domain)
    b += b''.join(fld(2, 2, d) for d in descs)
    if hits is not None: b += fld(3, 0, hits)
    return b
def overall(resp):  # first field varint
    if not resp: return 0
    if resp[0] == 0x08: return resp[1]
    return 0
METHOD = '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit'
def stub(target='127.0.0.1:18081', **kw):
    ch = grpc.insecure_channel(target, **kw)
    return ch, ch.unary_unary(METHOD, request_serializer=lambda x: x, response_deserializer=lambda x: x)
CODES = {0: 'UNKNOWN', 1: 'OK', 2: 'OVER_LIMIT'}
