#!/usr/bin/env bash
# Gateway throughput and latency, side by side in one run (docs/BENCHMARKS.md):
#   nginx upstream (returns 200 "ok") <- {sluice gateway with limiting, sluice gateway without,
#   nginx proxy_pass, a bare hyper proxy (the ceiling), Envoy 1.40 + ratelimit filter -> sluice gRPC}
# Needs: wrk, nginx (Debian packages), target/envoy-venv/bin/envoy (the README test command
# installs it), a release build: cargo build --release -p sluice-cli
# The gateways run WORKERS worker threads and nginx proxy_pass as many worker processes (one
# per CPU unless WORKERS says); Envoy runs one worker (--concurrency 1). SLUICE_THREADS sizes
# only the main runtime (gRPC, JSON API, admin, flush timer).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
# Worker threads of every gateway and worker processes of nginx proxy_pass: equal, one per CPU
# unless WORKERS says.
WORKERS=${WORKERS:-$(nproc)}
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT

# Upstream: nginx returning 200.
cat > "$W/upstream.conf" <<CONF
worker_processes 1; daemon off; pid $W/up.pid; error_log $W/up.err;
events { worker_connections 4096; }
http { access_log off; server { listen 127.0.0.1:18100; location / { return 200 "ok"; } } }
CONF
nginx -c "$W/upstream.conf" -p "$W" &
# nginx proxy_pass in front of it.
cat > "$W/proxy.conf" <<CONF
worker_processes $WORKERS; daemon off; pid $W/px.pid; error_log $W/px.err;
events { worker_connections 4096; }
http { access_log off; upstream up { server 127.0.0.1:18100; keepalive 64; }
  server { listen 127.0.0.1:18101; location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
CONF
nginx -c "$W/proxy.conf" -p "$W" &

mkdir -p "$W/rules"
printf 'domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: second, requests_per_unit: 1000000000 }\n' > "$W/rules/edge.yaml"
cat > "$W/on.yaml" <<CONF
listen: { http: 127.0.0.1:18110, grpc: 127.0.0.1:18111, admin: 127.0.0.1:18112 }
rules: [rules/]
gateways:
  - listen: 127.0.0.1:18102
    upstream: http://127.0.0.1:18100
    domain: edge
    workers: $WORKERS
    routes:
      - match: { path_prefix: / }
        rate_limits: [{ actions: [{ request_headers: { header_name: x-user-id, descriptor_key: user } }] }]
CONF
cat > "$W/off.yaml" <<CONF
listen: { http: 127.0.0.1:18120, grpc: 127.0.0.1:18121, admin: 127.0.0.1:18122 }
rules: [rules/]
gateways:
  - listen: 127.0.0.1:18103
    upstream: http://127.0.0.1:18100
    domain: edge
    workers: $WORKERS
    routes: []
CONF
RUST_LOG=error TOKIO_WORKER_THREADS=${SLUICE_THREADS:-2} ./target/release/sluice serve --config "$W/on.yaml" &
RUST_LOG=error TOKIO_WORKER_THREADS=${SLUICE_THREADS:-2} ./target/release/sluice serve --config "$W/off.yaml" &
# SLUICE_B=/path/to/another/sluice: that binary too, limiting on, for an A/B in the same run.
if [ -n "${SLUICE_B:-}" ]; then
  sed -e 's/1811/1813/g' -e 's/18102/18105/' "$W/on.yaml" > "$W/b.yaml"
  RUST_LOG=error TOKIO_WORKER_THREADS=${SLUICE_THREADS:-2} "$SLUICE_B" serve --config "$W/b.yaml" &
fi
# The ceiling: a proxy with nothing but hyper (its server and pooled client), as many workers
# (crates/sluice-http/examples/bare_proxy.rs).
[ -x target/release/examples/bare_proxy ] || cargo build --release -p sluice-http --example bare_proxy
./target/release/examples/bare_proxy pool 127.0.0.1:18106 127.0.0.1:18100 "$WORKERS" &
if [ -x target/envoy-venv/bin/envoy ]; then
  sed -e 's/port_value: 10000/port_value: 18104/' -e 's/port_value: 3000/port_value: 18100/' -e 's/port_value: 8081/port_value: 18111/' examples/envoy.yaml > "$W/envoy.yaml"
  target/envoy-venv/bin/envoy -c "$W/envoy.yaml" --concurrency 1 --log-level error --base-id 18104 > "$W/envoy.log" 2>&1 &
fi
sleep 3

ROUNDS=${ROUNDS:-3}
# Each target runs ROUNDS times, interleaved (the VM's speed drifts over a minute); the table
# shows each target's median round.
run() {
  local name=$1 port=$2
  wrk -t1 -c"$CONNS" -d"$DURATION" --latency -H 'x-user-id: bench' "http://127.0.0.1:$port/" \
    | awk -v n="$name" '/Requests\/sec/ {rps=$2} /^ +50%/ {p50=$2} /^ +99%/ {p99=$2} END {printf "%s|%s|%s|%s\n", n, rps, p50, p99}' >> "$W/results"
}
echo "wrk -t1 -c$CONNS -d$DURATION x $ROUNDS rounds, 2 vCPUs shared by wrk, the proxy and the upstream"
for _ in $(seq "$ROUNDS"); do
  run "upstream direct (nginx return 200)" 18100
  run "nginx proxy_pass" 18101
  run "bare hyper proxy (ceiling)" 18106
  run "sluice gateway, limiting off" 18103
  run "sluice gateway, limiting on" 18102
  if [ -n "${SLUICE_B:-}" ]; then run "sluice gateway, limiting on (B)" 18105; fi
  if [ -x target/envoy-venv/bin/envoy ]; then run "envoy + ratelimit filter -> sluice" 18104; fi
done
# Median round per target (by req/s), in the order first seen; then the ratios the targets name.
awk -f scripts/median-round.awk "$W/results" | awk -F'|' '
  { med[$1] = $2; printf "%-34s %10s req/s   p50 %8s   p99 %8s   (rounds:%s)\n", $1, $2, $3, $4, $5 }
  END {
    on = med["sluice gateway, limiting on"]; off = med["sluice gateway, limiting off"]; ng = med["nginx proxy_pass"]; ev = med["envoy + ratelimit filter -> sluice"]
    bare = med["bare hyper proxy (ceiling)"]
    printf "on/off %.0f%%   on/nginx %.0f%%   off/nginx %.0f%%   on/bare %.0f%%   bare/nginx %.0f%%", 100 * on / off, 100 * on / ng, 100 * off / ng, 100 * on / bare, 100 * bare / ng
    if (ev > 0) printf "   on/envoy %.1fx", on / ev
    printf "\n"
  }'
