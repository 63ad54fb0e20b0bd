#!/bin/bash
# bytes of sluice log per hostile request of each kind; and what /status.json shows of keys
L=${ATTACK_LOGS:-target/attacks}/sluice.log; G=127.0.0.1:18000; H=127.0.0.1:18080
m() { local n=${3:-200}; local b=$(stat -c %s $L); for i in $(seq $n); do eval "$1" >/dev/null 2>&1; done; sleep 0.3; echo "$2: +$(( $(stat -c %s $L) - b )) log bytes / $n requests"; }
m "curl -s -XPOST $H/json -d '{bad'" "bad JSON /json"
m "curl -s -XPOST $H/v1/acquire -d '{\"user\":\"a\"}'" "missing field /v1/acquire"
m "curl -s $G/%zz" "malformed escape via gateway"
m "curl -s -H 'x-user-id: a' -H 'x-user-id: b' $G/" "duplicate header via gateway"
m "curl -s $G/slow -m 0.3" "client abort mid-upstream" 10
m "printf 'GARBAGE\r\n\r\n' | timeout 1 python3 -c 'import socket,sys; s=socket.create_connection((\"127.0.0.1\",18000)); s.sendall(sys.stdin.buffer.read()); s.recv(100)'" "garbage request line"
m "curl -s --http2-prior-knowledge -XPOST $H/json -H 'content-type: application/json' -d '{}'" "h2c bad /json"
python3 - <<'PY'
import urllib.request, json
for u in ['10.1.2.3-secret-session-token-abcdef0123456789', 'alice@example.com-some-long-email']:
    for _ in range(5):
        try: urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:18000/', headers={'x-user-id': u}))
        except Exception: pass
s = urllib.request.urlopen('http://127.0.0.1:18090/status.json').read().decode()
print('status.json contains full secret value:', '10.1.2.3-secret-session-token-abcdef0123456789' in s, '| contains "secret":', 'secret' in s, '| contains email:', 'alice@example.com' in s)
import re; print('heavy key samples:', re.findall(r'"key":"[^"]*"', s)[:6])
PY
