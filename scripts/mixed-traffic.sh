#!/bin/sh
# The mix of users on five real `sluice serve` instances and one real Redis, and in the
# simulator, judged class by class (docs/ACCURACY.md, "A mix of users"): per class the worst
# and p99 window over the limit, busy windows (demand at least 1.2x the limit) admitted under
# 95%, false denials (denials in key-windows whose demand stayed within the limit), and the
# store commands per request, for the real processes and the simulator side by side.
# Usage: scripts/mixed-traffic.sh [SCENARIO...]   (default: examples/scenarios/mix/five.yaml,
# five minutes of traffic per policy it names: about 11 minutes for predictive and reactive)
# Needs redis-server on the PATH; starts its own on a free port.
set -eu
if [ $# -eq 0 ]; then
    set -- examples/scenarios/mix/five.yaml
fi
exec "$(dirname "$0")/fleet-vs-sim.sh" "$@"
