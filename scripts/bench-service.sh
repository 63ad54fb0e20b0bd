#!/usr/bin/env bash
# The decision service side by side in one run (docs/BENCHMARKS.md, "Decision service"):
#   Sluice RLS gRPC ShouldRateLimit, POST /json and POST /v1/acquire (ad-hoc token bucket)
#   against throttlecrab-server's gRPC Throttle and HTTP /throttle, with the same keys and
#   limits, and the do-nothing ceilings measured the same way: nginx `return 200` with a JSON
#   body over HTTP/1.1 (wrk) and over h2c (h2load), with as many workers as Sluice has threads,
#   and axum and tonic doing nothing on the same per-thread runtimes as Sluice (its stack's ceiling).
# Rounds are interleaved (the VM's speed drifts over a minute); each target's median round is
# reported with its p99, then the ratios issue 40 names. With PROFILE=1 (the default when perf
# is installed) a last /v1/acquire load runs under `perf record` and the top of the profile is
# printed: where Sluice's time goes per request.
#
# Installs what is missing: wrk, h2load (nghttp2-client), nginx, perf (linux-perf) and
# protoc (protobuf-compiler, for throttlecrab's gRPC) from Debian; throttlecrab-server with
# `cargo install --locked`; builds target/release/sluice when it is not there.
#
# Knobs: DURATION (seconds per round, default 10), ROUNDS (3), CONNS (wrk connections, 64),
# H2_CONNS x H2_STREAMS (h2load, 32 x 16), KEYS (distinct users, 10000), THREADS (Sluice's and
# throttlecrab's runtime threads and nginx's workers, default: the CPUs), PROFILE (0 or 1),
# SLUICE_B (another sluice binary, served beside the first for an A/B in the same run).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
H2_CONNS=${H2_CONNS:-32}
H2_STREAMS=${H2_STREAMS:-16}
KEYS=${KEYS:-10000}
THREADS=${THREADS:-$(nproc)}
THROTTLECRAB_VERSION=${THROTTLECRAB_VERSION:-0.4.40}

# 1. Tools.
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v h2load >/dev/null || missing+=(nghttp2-client)
command -v nginx >/dev/null || missing+=(nginx)
command -v perf >/dev/null || missing+=(linux-perf)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
if [ ${#missing[@]} -gt 0 ]; then apt-get update && apt-get install -y "${missing[@]}"; fi
if ! command -v throttlecrab-server >/dev/null; then
  cargo install --locked throttlecrab-server --version "$THROTTLECRAB_VERSION"
fi
[ -x target/release/sluice ] || cargo build --release -p sluice-cli
[ -x target/release/examples/do_nothing ] || cargo build --release -p sluice-rls --example do_nothing
PROFILE=${PROFILE:-$(command -v perf >/dev/null && echo 1 || echo 0)}

W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT

# 2. The servers. Every limit is a token bucket of 1,000,000 a minute, burst 1,000,000:
# nothing is denied, so every target does the same work for every request.
mkdir -p "$W/rules"
printf 'domain: bench\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 1000000 }\n' > "$W/rules/bench.yaml"
cat > "$W/sluice.yaml" <<CONF
listen: { http: 127.0.0.1:18200, grpc: 127.0.0.1:18201, admin: 127.0.0.1:18202 }
rules: [rules/]
CONF
RUST_LOG=error TOKIO_WORKER_THREADS=$THREADS ./target/release/sluice serve --config "$W/sluice.yaml" &
SLUICE_PID=$!
if [ -n "${SLUICE_B:-}" ]; then
  sed 's/1820\([0-2]\)/1823\1/g' "$W/sluice.yaml" > "$W/b.yaml"
  RUST_LOG=error TOKIO_WORKER_THREADS=$THREADS "$SLUICE_B" serve --config "$W/b.yaml" &
fi
RUST_LOG=error TOKIO_WORKER_THREADS=$THREADS throttlecrab-server --http --http-port 18210 \
  --grpc --grpc-port 18211 --log-level error > "$W/throttlecrab.log" 2>&1 &
# Do-nothing ceilings: a constant JSON answer over HTTP/1.1, and over HTTP/2 without TLS.
cat > "$W/nginx.conf" <<CONF
worker_processes $THREADS; daemon off; pid $W/nginx.pid; error_log $W/nginx.err;
events { worker_connections 4096; }
http {
  access_log off; default_type application/json; keepalive_requests 1000000000;
  server { listen 127.0.0.1:18220; location / { return 200 '{"allowed":true,"remaining":999999,"retry_after_ms":null,"reset_after_ms":0}'; } }
  server { listen 127.0.0.1:18221 http2;
           location / { return 200 '{"overallCode":"OK"}'; } }
}
CONF
nginx -c "$W/nginx.conf" -p "$W" &
# The ceiling of Sluice's own stack: axum and tonic answering constants on the same per-thread
# runtimes as `sluice serve`'s listeners (crates/sluice-rls/examples/do_nothing.rs).
./target/release/examples/do_nothing 127.0.0.1:18250 127.0.0.1:18251 "$THREADS" &
sleep 3

# 3. The requests. wrk picks one of KEYS users per request; h2load sends one message body
# (one user) over every stream.
lua() { # $1: file, $2: path, $3: body with USER where the user goes
  cat > "$1" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
math.randomseed(os.time())
request = function()
  local body = string.gsub('$3', "USER", "u" .. math.random($KEYS))
  return wrk.format(nil, "$2", nil, body)
end
LUA
}
lua "$W/acquire.lua" /v1/acquire '{"user":"USER","item":"bench","limit":{"requests":1000000,"window":"1m","burst":1000000}}'
lua "$W/json.lua" /json '{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"USER"}]}]}'
lua "$W/throttle.lua" /throttle '{"key":"USER","max_burst":1000000,"count_per_period":1000000,"period":60,"quantity":1}'
lua "$W/ceiling.lua" / '{"user":"USER"}'
# gRPC bodies: the 5-byte gRPC frame header, then the protobuf message.
python3 - "$W" <<'PY'
import struct, sys
def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])
def field(no, payload):  # length-delimited
    return varint(no << 3 | 2) + varint(len(payload)) + payload
def num(no, n):
    return varint(no << 3) + varint(n)
def frame(msg):
    return b"\0" + struct.pack(">I", len(msg)) + msg
entry = field(1, b"user") + field(2, b"u4242")
rls = field(1, b"bench") + field(2, field(1, entry)) + num(3, 1)
crab = field(1, b"u4242") + num(2, 1000000) + num(3, 1000000) + num(4, 60) + num(5, 1)
open(sys.argv[1] + "/rls.bin", "wb").write(frame(rls))
open(sys.argv[1] + "/crab.bin", "wb").write(frame(crab))
PY

# 4. Interleaved rounds. Each line of $W/results: name|req/s|p50|p99 (ms).
ms() { # wrk's latency ("812.00us", "2.31ms", "1.02s") in ms
  awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /s$/ && v !~ /ms$/) n *= 1000; printf "%.2f", n }'
}
http() { # name port script
  local out
  out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s "$3" "http://127.0.0.1:$2")
  local rps p50 p99 errors
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '/^ +50%/ {print $2}' <<<"$out")
  p99=$(awk '/^ +99%/ {print $2}' <<<"$out")
  errors=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
  [ -z "$errors" ] || echo "warning: $1 answered $errors non-2xx responses" >&2
  echo "$1|$rps|$(ms "$p50")|$(ms "$p99")" >> "$W/results"
}
grpc() { # name port path body
  local out
  rm -f "$W/h2.log"
  out=$(h2load -c"$H2_CONNS" -m"$H2_STREAMS" -D "$DURATION" --log-file="$W/h2.log" -d "$4" \
    -H 'content-type: application/grpc' -H 'te: trailers' "http://127.0.0.1:$2$3")
  local rps failed
  rps=$(awk '/^finished in/ {print $4}' <<<"$out")
  failed=$(awk '/^requests:/ {print $(NF-5)}' <<<"$out")
  [ "${failed:-0}" = 0 ] || echo "warning: $1: $failed requests failed" >&2
  # The log's third column is each request's time in microseconds.
  local pcts
  pcts=$(cut -f3 "$W/h2.log" | sort -n | awk '{ v[NR] = $1 } END { printf "%.2f|%.2f", v[int(NR * 0.5)] / 1000, v[int(NR * 0.99)] / 1000 }')
  echo "$1|$rps|$pcts" >> "$W/results"
}
echo "$ROUNDS rounds of ${DURATION}s; HTTP: wrk -t1 -c$CONNS, $KEYS users; gRPC: h2load -c$H2_CONNS -m$H2_STREAMS, one user; $THREADS threads/workers; $(nproc) CPUs shared with the load generator; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "$ROUNDS"); do
  http "ceiling: nginx return 200 (HTTP/1.1)" 18220 "$W/ceiling.lua"
  http "ceiling: axum do-nothing (HTTP/1.1)" 18250 "$W/ceiling.lua"
  http "sluice /v1/acquire" 18200 "$W/acquire.lua"
  http "sluice /json" 18200 "$W/json.lua"
  if [ -n "${SLUICE_B:-}" ]; then
    http "sluice B /v1/acquire" 18230 "$W/acquire.lua"
    http "sluice B /json" 18230 "$W/json.lua"
  fi
  http "throttlecrab /throttle" 18210 "$W/throttle.lua"
  grpc "ceiling: nginx return 200 (h2c)" 18221 / "$W/rls.bin"
  grpc "ceiling: tonic do-nothing (h2c)" 18251 /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit "$W/rls.bin"
  grpc "sluice RLS gRPC" 18201 /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit "$W/rls.bin"
  if [ -n "${SLUICE_B:-}" ]; then
    grpc "sluice B RLS gRPC" 18231 /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit "$W/rls.bin"
  fi
  grpc "throttlecrab gRPC" 18211 /throttlecrab.RateLimiter/Throttle "$W/crab.bin"
done

# 5. Median round per target (by req/s), then the ratios issue 40 sets targets for.
awk -f scripts/median-round.awk "$W/results" | awk -F'|' '
  {
    med[$1] = $2; p99[$1] = $4
    printf "%-40s %10.0f req/s   p50 %6.2f ms   p99 %6.2f ms   (rounds:%s)\n", $1, $2, $3, $4, $5
  }
  END {
    h1 = med["ceiling: nginx return 200 (HTTP/1.1)"]; h2 = med["ceiling: nginx return 200 (h2c)"]
    printf "/v1/acquire: %.2fx the ceiling, p99 %.2f ms vs throttlecrab %.2f ms\n", med["sluice /v1/acquire"] / h1, p99["sluice /v1/acquire"], p99["throttlecrab /throttle"]
    printf "/json: %.2fx the ceiling, p99 %.2f ms\n", med["sluice /json"] / h1, p99["sluice /json"]
    ax = med["ceiling: axum do-nothing (HTTP/1.1)"]; tn = med["ceiling: tonic do-nothing (h2c)"]
    printf "axum doing nothing: %.2fx nginx; /v1/acquire %.2fx and /json %.2fx of it; tonic doing nothing: %.2fx nginx h2c, RLS gRPC %.2fx of it\n", ax / h1, med["sluice /v1/acquire"] / ax, med["sluice /json"] / ax, tn / h2, med["sluice RLS gRPC"] / tn
    printf "RLS gRPC: %.2fx the h2c ceiling, %.2fx throttlecrab gRPC, p99 %.2f ms vs %.2f ms\n", med["sluice RLS gRPC"] / h2, med["sluice RLS gRPC"] / med["throttlecrab gRPC"], p99["sluice RLS gRPC"], p99["throttlecrab gRPC"]
  }'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# 6. Where Sluice's time goes per request: /v1/acquire under load, sampled with perf.
if [ "$PROFILE" = 1 ]; then
  wrk -t1 -c"$CONNS" -d"$((DURATION + 2))s" -s "$W/acquire.lua" http://127.0.0.1:18200 > /dev/null &
  load=$!
  sleep 1
  perf record -F 999 -g -p "$SLUICE_PID" -o "$W/perf.data" -- sleep "$DURATION" 2> /dev/null
  wait "$load"
  echo "perf: Sluice under /v1/acquire load, self time by symbol (top entries)"
  perf report -i "$W/perf.data" --no-children --sort dso,symbol -g none --stdio --percent-limit 0.7 \
    2> /dev/null | grep -E '^ +[0-9.]+%' | cut -c1-140 | sed 's/ *$//' | head -40
fi
