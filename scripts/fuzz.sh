#!/usr/bin/env bash
# Fuzzing Sluice's input paths with cargo fuzz (libFuzzer, AddressSanitizer, debug assertions
# and overflow checks on). The targets are in fuzz/fuzz_targets; docs/RELIABILITY.md lists them.
#
#   scripts/fuzz.sh smoke            every target: its committed corpus, then 5 s of mutation
#                                    with a fixed seed (the test command runs this)
#   scripts/fuzz.sh long [SECONDS]   every target for SECONDS (default 600) from the committed
#                                    corpus; prints one summary line per target
#   scripts/fuzz.sh TARGET [ARGS]    one target, libFuzzer ARGS after `--`
#
# Needs the nightly toolchain (cargo fuzz builds with -Zsanitizer) and cargo-fuzz, which is
# installed from crates.io when missing. New inputs go to a scratch corpus under target/, not
# into fuzz/corpus: to keep them, minimize with `cargo +nightly fuzz cmin` and commit.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

TARGETS=(rules_yaml service_yaml http_api grpc_request rlqs_report gateway_request redis_replies etcd_replies engine_store spill_file geoip_database)

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz.sh: the nightly toolchain is missing (rustup toolchain install nightly)" >&2
    exit 1
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --quiet

build() { cargo +nightly fuzz build -O -a "$@"; }

run() { # target seconds seed
    local scratch="../target/fuzz-scratch/$1"
    mkdir -p "$scratch" "corpus/$1"
    local args=(-max_total_time="$2" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1)
    [ -n "${3:-}" ] && args+=(-seed="$3")
    cargo +nightly fuzz run -O -a "$1" "$scratch" "corpus/$1" -- "${args[@]}" 2>&1 \
        | tee "../target/fuzz-scratch/$1.log" \
        | grep -E "^(Done|==[0-9]+== ERROR|SUMMARY|thread '.*' panicked)|^stat::number_of_executed_units|^stat::peak_rss_mb" \
        | sed "s/^/$1: /"
}

case "${1:-smoke}" in
    smoke)
        build
        for t in "${TARGETS[@]}"; do run "$t" 5 1; done
        ;;
    long)
        build
        for t in "${TARGETS[@]}"; do run "$t" "${2:-600}"; done
        ;;
    *)
        t="$1"
        shift
        build "$t"
        cargo +nightly fuzz run -O -a "$t" "corpus/$t" -- "$@"
        ;;
esac
