#!/bin/sh
# Runs simulator scenarios on real processes (one real Redis, one `sluice serve` per node) and in
# the simulator, and prints both window by window (docs/ACCURACY.md, "A key's first window").
# Usage: scripts/fleet-vs-sim.sh [SCENARIO...]   (default: examples/scenarios/first-window/three.yaml five.yaml)
# Needs redis-server on the PATH. Nodes that join, leave or crash do so on the real side as a
# `sluice serve` started (a second ahead of its join time), stopped with SIGTERM or killed with
# SIGKILL. Scenarios with clock skews, store latency over 1 ms or outages are refused: the real
# run cannot reproduce them.
set -eu
cargo build --release -q -p sluice-cli --bin sluice --example fleet_vs_sim
if [ $# -eq 0 ]; then
    set -- examples/scenarios/first-window/three.yaml examples/scenarios/first-window/five.yaml
fi
for f in "$@"; do
    target/release/examples/fleet_vs_sim "$f" target/release/sluice
    echo
done
