#!/bin/bash
# Starts the attack bench from the repository root: a counting upstream on :18300 and
# `sluice serve` with cfg/$1 (default sluice.yaml; listeners on :18080 http, :18081 grpc,
# :18090 admin, :18000 gateway), logs and pids in $ATTACK_LOGS (default target/attacks).
# Stop them with: kill $(cat target/attacks/*.pid)
# The Python attacks need `pip install h2 grpcio` (a venv: python3 -m venv target/attack-venv).
set -euo pipefail
here=$(dirname "$0")
logs=${ATTACK_LOGS:-target/attacks}
sluice=${SLUICE:-target/release/sluice}
cfg=${1:-sluice.yaml}
mkdir -p "$logs"
if ! [ -f "$logs/upstream.pid" ] || ! kill -0 "$(cat "$logs/upstream.pid")" 2>/dev/null; then
    python3 "$here/upstream.py" 18300 > "$logs/upstream.log" 2>&1 &
    echo $! > "$logs/upstream.pid"
fi
if [ -f "$logs/sluice.pid" ] && kill -0 "$(cat "$logs/sluice.pid")" 2>/dev/null; then
    kill "$(cat "$logs/sluice.pid")"
    sleep 1
fi
(cd "$here/cfg" && exec "$OLDPWD/$sluice" serve --config "$cfg") > "$logs/sluice.log" 2>&1 &
echo $! > "$logs/sluice.pid"
for _ in $(seq 50); do curl -s -o /dev/null 127.0.0.1:18090/healthz && break; sleep 0.1; done
echo "sluice pid $(cat "$logs/sluice.pid")"
