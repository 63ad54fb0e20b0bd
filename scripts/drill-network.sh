#!/usr/bin/env bash
# The long network drills (docs/RELIABILITY.md): the suite's drills in
# crates/sluice-cli/tests/network.rs with every fault lasting SCALE times longer (default 5:
# a 15 s cut, 20 s of 500 ms latency and of 5% loss, a store that flaps every 2 s for
# a minute) and a spray of SPRAY keys (default 300,000) into one span. Each prints a
# `drill ...` line with what was admitted and what Redis holds. Needs root (network
# namespaces), iproute2, iptables and redis-server, like the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE=${SCALE:-5}
SPRAY=${SPRAY:-300000}
SLUICE_DRILL_SCALE=$SCALE SLUICE_DRILL_SPRAY=$SPRAY \
  cargo test --release -q -p sluice-cli --test network -- --test-threads 1 --nocapture 2>&1 |
  grep -oE 'drill .*|test result.*|panicked.*|FAILED.*'
