#!/bin/bash
# Admin listener without tokens: Host check spellings (DNS rebinding), cross-site POST /reload (CSRF), reload flood
A=127.0.0.1:18090
for h in evil.com localhost 127.0.0.1 "127.0.0.1.nip.io" "localhost.evil.com" "localhost." "LOCALHOST" "127.1" "0x7f000001" "[::1]" "evil.com:18090" "localhost:18090@evil.com" "127.0.0.1 evil.com" "evil.localhost" "2130706433"; do
  printf '%-28s /status.json=%s /metrics=%s POST/reload=%s\n' "$h" \
   "$(curl -s -o /dev/null -w '%{http_code}' -H "Host: $h" $A/status.json)" \
   "$(curl -s -o /dev/null -w '%{http_code}' -H "Host: $h" $A/metrics)" \
   "$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Host: $h" $A/reload)"
done
echo "HTTP/1.0 no Host:"; printf 'GET /status.json HTTP/1.0\r\n\r\n' | timeout 2 nc -q1 127.0.0.1 18090 | head -1
echo "absolute-form with evil authority:"; printf 'GET http://evil.com/status.json HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' | timeout 2 nc -q1 127.0.0.1 18090 | head -1
echo "CSRF-shaped POST (browser on evil.com posting to http://127.0.0.1:18090/reload, text/plain, Origin set):"
curl -s -w ' [%{http_code}]\n' -X POST -H 'Origin: http://evil.com' -H 'Content-Type: text/plain' -H 'Sec-Fetch-Site: cross-site' $A/reload
