#!/bin/bash
# Gateway spellings not covered by the fix: ';' as query separator, parameter-name case,
# and method override (route {path:/items, method: DELETE}, limit 3/min; route /q keyed on ?user=, limit 3/min)
G=127.0.0.1:18000; U=127.0.0.1:18300
curl -s $U/__reset >/dev/null
c() { curl -s -o /dev/null -w '%{http_code} ' "$@"; }
echo "baseline ?user=bob x8:"; for i in $(seq 8); do c "$G/q?user=bob"; done; echo
echo "';' separator ?x=1;user=bob x8:"; for i in $(seq 8); do c "$G/q?x=$i;user=bob"; done; echo
echo "no param at all x8:"; for i in $(seq 8); do c "$G/q?u$i=1"; done; echo
echo "name case ?USER=bob x8:"; for i in $(seq 8); do c "$G/q?USER=bob"; done; echo
echo "php-style ?user[]=bob x8:"; for i in $(seq 8); do c "$G/q?user%5B%5D=bob"; done; echo
echo "DELETE /items x8:"; for i in $(seq 8); do c -X DELETE $G/items; done; echo
echo "POST /items + X-HTTP-Method-Override: DELETE x8:"; for i in $(seq 8); do c -X POST -H 'X-HTTP-Method-Override: DELETE' $G/items; done; echo
echo "POST /items?_method=DELETE x8:"; for i in $(seq 8); do c -X POST "$G/items?_method=DELETE"; done; echo
echo "delete (lower-case method) x4:"; for i in $(seq 4); do c -X delete $G/items; done; echo
echo "upstream saw:"; curl -s $U/__counts; echo
