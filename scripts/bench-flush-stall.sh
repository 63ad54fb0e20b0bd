#!/usr/bin/env bash
# The flush of a key spray against the request path (docs/RELIABILITY.md): a fresh Redis and
# `sluice serve` (a synced rule, 1-minute window, 6 spans: a flush every 10 s); KEYS distinct
# keys (default 1,000,000) sprayed through gRPC as fast as the load tool can; meanwhile a
# client checks one other key every 2 ms and records its latency. Prints when every sprayed
# key's count was in Redis (seconds after the spray ended, and in spans), and the watching
# client's latency during the spray and from the spray's end until the flush was done.
# Needs: cargo build --release -p sluice-cli --bin sluice --example hostile_load
# BIN=path runs another server binary (to compare builds in one sitting); CHUNK=N sets
# flush_chunk_items.
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=${KEYS:-1000000}
BIN=${BIN:-./target/release/sluice}
LOAD=./target/release/examples/hostile_load
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
ulimit -n "$(ulimit -Hn)"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RP=$(free_port); GRPC=$(free_port); HTTP=$(free_port); ADMIN=$(free_port)
redis-server --port "$RP" --save '' --appendonly no --dir "$W" >/dev/null &
until redis-cli -p "$RP" ping >/dev/null 2>&1; do sleep 0.1; done

mkdir -p "$W/rules"
cat > "$W/rules/edge.yaml" <<RULES
domain: edge
descriptors:
  - key: victim
    rate_limit: { unit: minute, requests_per_unit: 5, mode: synced, spans: 6 }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 5, mode: synced, spans: 6 }
RULES
cat > "$W/sluice.yaml" <<CONF
store: redis://127.0.0.1:$RP/
listen: { http: 127.0.0.1:$HTTP, grpc: 127.0.0.1:$GRPC, admin: 127.0.0.1:$ADMIN }
rules: [rules/]
${CHUNK:+flush_chunk_items: $CHUNK}
CONF
RUST_LOG=warn "$BIN" serve --config "$W/sluice.yaml" 2>"$W/serve.log" &
until curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null; do sleep 0.1; done

# Start right after a span boundary, so the spray lands in as few spans as it can.
sleep "$(python3 -c 'import time; print(10 - time.time() % 10 + 0.2)')"
"$LOAD" watch "127.0.0.1:$GRPC" 90 > "$W/watch.txt" &
WATCH=$!
sleep 2
BASE=$(items() { curl -s "http://127.0.0.1:$ADMIN/metrics" | awk '/^sluice_flush_items_total /{print $2}' | cut -d. -f1; }; items)
BASE=${BASE:-0}
start=$(date +%s.%N)
"$LOAD" spray grpc "127.0.0.1:$GRPC" "$KEYS"
end=$(date +%s.%N)
# Flushed: the flush has sent every sprayed key (`sluice_flush_items_total` grew by KEYS;
# items held back or failed would be sent again, and are reported below).
items() { curl -s "http://127.0.0.1:$ADMIN/metrics" | awk '/^sluice_flush_items_total /{print $2}' | cut -d. -f1; }
done_at=""
for _ in $(seq 1 600); do
  if [ "$(items || echo 0)" -ge "$((BASE + KEYS))" ]; then
    done_at=$(date +%s.%N); break
  fi
  sleep 0.2
done
kill "$WATCH" 2>/dev/null || true
wait "$WATCH" 2>/dev/null || true
python3 - "$start" "$end" "${done_at:-0}" "$W/watch.txt" "$KEYS" <<'PY'
import sys
start, end, done, path, keys = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
rows = [list(map(float, l.split())) for l in open(path) if l.strip()]
def summary(lo, hi):
    sel = [r for r in rows if lo <= r[0] < hi]
    if not sel: return "no samples"
    n = sum(r[1] for r in sel); over = sum(r[4] for r in sel)
    return f"{int(n)} checks, worst second's p99 {max(r[2] for r in sel):.2f} ms, max {max(r[3] for r in sel):.2f} ms, {int(over)} above 10 ms"
print(f"spray: {keys} keys in {end-start:.1f} s")
if done:
    print(f"all {keys} counted in Redis {done-end:.1f} s after the spray ended ({(done-end)/10:.1f} spans of 10 s; {done-start:.1f} s after it began)")
else:
    print("NOT all counted in Redis within 300 s")
print("before the spray:", summary(0, int(start)))
print("during the spray:", summary(int(start), int(end) + 1))
print("spray end to flushed:", summary(int(end) + 1, int(done or end) + 1))
PY
curl -s "http://127.0.0.1:$ADMIN/metrics" | grep -E '^sluice_flushes_total|^sluice_flush_items_held_total' || true
grep "flush failed\|did not reach" "$W/serve.log" | cut -c1-300 | head -5 || true
# Every sprayed key's count in Redis (one call that blocks Redis for a second or two, after
# the measurement).
SUM="local s = 0 for _, k in ipairs(redis.call('KEYS', '*victim*')) do if not string.find(k, ':n$') and not string.find(k, ':r:') then s = s + (tonumber(redis.call('GET', k)) or 0) end end return s"
echo "sprayed counts in Redis: $(redis-cli -p "$RP" eval "$SUM" 0) of $KEYS"
