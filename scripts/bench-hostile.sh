#!/usr/bin/env bash
# Hostile-load figures (docs/RELIABILITY.md), each door against a fresh `sluice serve`:
#  1. key spray: KEYS distinct values (default 10,000,000) of one rule through each front door
#     (gRPC, /json, /v1/acquire/batch, gateway; `adhoc`, in DOORS only when named: acquires
#     with an ad-hoc limit over 1,000 shapes); resident memory before and after (VmRSS) and
#     its peak (VmHWM); then a rule that was not sprayed must still allow exactly 5 of 6.
#  2. slow clients: CONNS (default 2,000) connections trickling request heads or idle against
#     the HTTP API; p99 of a well-behaved client and of admin /healthz, alone and under attack.
# Needs a release build of the server and the load tool:
#   cargo build --release -p sluice-cli --bin sluice --example hostile_load
# STORE=redis://127.0.0.1:PORT/ runs the rules in synced mode on that Redis (start your own);
# PAD=N pads every sprayed value to N bytes (the gRPC and /json doors take at most 1,024);
# SETTLE=S waits S seconds after each spray before reading memory (let a synced flush run).
# EXPECTED=N sets expected_instances: N; with STORE and N >= 3 the rules' 5 a minute is a limit
# too small to share, decided at the store (at most exact.small_limit_calls a second per rule);
# the Redis calls each spray made are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=${KEYS:-10000000}
CONNS=${CONNS:-2000}
SLOW_SECONDS=${SLOW_SECONDS:-30}
DOORS=${DOORS:-grpc json batch gateway}
BIN=./target/release/sluice
LOAD=./target/release/examples/hostile_load
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
ulimit -n "$(ulimit -Hn)"

mkdir -p "$W/rules"
MODE=""
[ -n "${STORE:-}" ] && MODE=", mode: synced"
cat > "$W/rules/edge.yaml" <<RULES
domain: edge
descriptors:
  - key: victim
    rate_limit: { unit: minute, requests_per_unit: 5$MODE }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 5$MODE }
RULES
cat > "$W/rules/api.yaml" <<RULES
domain: api
descriptors:
  - key: item
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 5$MODE }
  - key: item
    value: probe
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 5$MODE }
RULES
cat > "$W/sluice.yaml" <<CONF
${STORE:+store: $STORE}
${EXPECTED:+expected_instances: $EXPECTED}
listen: { http: 127.0.0.1:18410, grpc: 127.0.0.1:18411, admin: 127.0.0.1:18412 }
rules: [rules/]
api: { domain: api }
gateways:
  - listen: 127.0.0.1:18413
    upstream: http://127.0.0.1:18414
    domain: edge
    routes:
      - match: { path_prefix: / }
        rate_limits:
          - actions: [{ request_headers: { header_name: x-victim, descriptor_key: victim } }]
          - actions: [{ request_headers: { header_name: x-user-id, descriptor_key: user } }]
CONF
"$LOAD" upstream 127.0.0.1:18414 &

kib() { awk -v k="$2" '$1 == k":" { print $2 }' "/proc/$1/status"; }
# Calls of each command the store served so far (`evalsha:N incrby:N ...`), with STORE.
calls() {
  [ -n "${STORE:-}" ] || return 0
  redis-cli -u "$STORE" INFO commandstats | tr -d '\r' \
    | awk -F'[_:=,]' '/^cmdstat_(evalsha|incrby|hset|pexpire)/ { printf "%s:%s ", $2, $4 }'
}
start() {
  RUST_LOG=${RUST_LOG:-error} "$BIN" serve --config "$W/sluice.yaml" &
  PID=$!
  for _ in $(seq 100); do curl -sf 127.0.0.1:18412/readyz >/dev/null && return; sleep 0.1; done
  echo "sluice serve did not start" >&2; exit 1
}
addr() { case $1 in grpc) echo 127.0.0.1:18411;; gateway) echo 127.0.0.1:18413;; *) echo 127.0.0.1:18410;; esac; }
# Keys the ad-hoc limits keep (gauge sluice_adhoc_keys), after an adhoc spray.
adhoc_keys() { curl -sf 127.0.0.1:18412/metrics | awk '$1 == "sluice_adhoc_keys" { print $2 }'; }

echo "# key spray: $KEYS keys per door, values padded to ${PAD:-0} bytes, store ${STORE:-memory}"
for door in $DOORS; do
  start
  before=$(kib $PID VmRSS); calls_before=$(calls)
  "$LOAD" spray "$door" "$(addr "$door")" "$KEYS"
  sleep "${SETTLE:-0}"
  after=$(kib $PID VmRSS); peak=$(kib $PID VmHWM)
  [ -n "${STORE:-}" ] && echo "$door: store calls before the spray: ${calls_before:-none}; after: $(calls)"
  "$LOAD" probe "$door" "$(addr "$door")" || true
  [ "$door" = adhoc ] && echo "adhoc: keys kept $(adhoc_keys)"
  echo "$door: RSS $((before / 1024)) MiB at start, $((after / 1024)) MiB after the spray, peak $((peak / 1024)) MiB"
  kill $PID; wait $PID 2>/dev/null || true
done

echo "# slow clients: $CONNS connections for ${SLOW_SECONDS}s"
start
"$LOAD" slow 127.0.0.1:18410 127.0.0.1:18412 "$CONNS" "$SLOW_SECONDS"
kill $PID; wait $PID 2>/dev/null || true
