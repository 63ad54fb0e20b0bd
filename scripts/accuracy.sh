#!/bin/sh
# Simulates every shipped scenario (and the first-window ones) and prints the Markdown tables of docs/ACCURACY.md.
# Usage: scripts/accuracy.sh [OUT_DIR]   (plots and summary.json per scenario under OUT_DIR)
set -eu
out=${1:-target/accuracy}
cargo build --release -q -p sluice-cli
for f in examples/scenarios/*.yaml examples/scenarios/first-window/*.yaml examples/scenarios/long/store-load.yaml; do
    name=$(basename "$f" .yaml)
    case $f in */first-window/*) name="first-window/$name" ;; */long/*) name="long/$name" ;; esac
    echo "### $name"
    echo
    echo "\`$f\`: $(sed -n '/^#/!q; s/^# //p' "$f" | tr '\n' ' ')"
    echo
    target/release/sluice simulate "$f" --out "$out/$name" --markdown | grep '^|'
    echo
done
