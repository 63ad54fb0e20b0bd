import os
# tiny raw HTTP/2 client helpers (h2 library) for hostile framing
import socket, h2.connection, h2.config, h2.events
def connect(port, host='127.0.0.1'):
    s = socket.create_connection((host, port))
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding='utf-8', validate_outbound_headers=False, normalize_outbound_headers=False))
    c.initiate_connection(); s.sendall(c.data_to_send())
    return s, c
def read_events(s, c, timeout=5.0):
    s.settimeout(timeout); evs = []
    try:
        data = s.recv(65536)
        if not data: return None
        evs = c.receive_data(data)
        out = c.data_to_send()
        if out: s.sendall(out)
    except socket.timeout: pass
    return evs
def grpc_call(s, c, sid, body, extra_headers=(), compressed=False, end=True):
    hdrs = [(':method', 'POST'), (':scheme', 'http'), (':path', '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit'),
            (':authority', '127.0.0.1'), ('content-type', 'application/grpc'), ('te', 'trailers')] + list(extra_headers)
    c.send_headers(sid, hdrs)
    frame = bytes([1 if compressed else 0]) + len(body).to_bytes(4, 'big') + body
    # respect flow control naively: chunk
    i = 0
    while i < len(frame):
        w = min(c.local_flow_control_window(sid), c.max_outbound_frame_size, len(frame) - i)
        if w <= 0:
            evs = read_events(s, c, 2)
            if evs is None: return
            continue
        c.send_data(sid, frame[i:i+w]); i += w
        s.sendall(c.data_to_send())
    if end: c.end_stream(sid); s.sendall(c.data_to_send())
def collect(s, c, sid, timeout=10.0):
    import time
    t = time.time(); hdrs = []; data = b''
    while time.time() - t < timeout:
        evs = read_events(s, c, 1)
        if evs is None: return hdrs, data, 'closed'
        for e in evs:
            if isinstance(e, (h2.events.ResponseReceived, h2.events.TrailersReceived)) and e.stream_id == sid: hdrs += e.headers
            if isinstance(e, h2.events.DataReceived) and e.stream_id == sid:
                data += e.data; c.acknowledge_received_data(e.flow_controlled_length, sid)
            if isinstance(e, h2.events.StreamEnded) and e.stream_id == sid: return hdrs, data, 'ended'
            if isinstance(e, h2.events.StreamReset) and e.stream_id == sid: return hdrs, data, 'reset %s' % e.error_code
            if isinstance(e, h2.events.ConnectionTerminated): return hdrs, data, 'goaway %s' % e.error_code
    return hdrs, data, 'timeout'
