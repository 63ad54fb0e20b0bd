#!/usr/bin/env python3
"""Functions longer than N lines (default 80) in the product crates' src/: length, place, name.

Usage: scripts/long-functions.py [ROOT] [N]   (ROOT: the workspace, default .)

A text reading (braces counted outside strings and comments). Marks a function with a reason
written above it (a comment saying "Over 80 lines ...") and those after the file's first
`#[cfg(test)]`."""
import os, re, sys
root = sys.argv[1] if len(sys.argv) > 1 else "."
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 80
for c in sorted(os.listdir(f"{root}/crates")):
    if c == "sluice-testkit": continue
    for d, _, fs in os.walk(f"{root}/crates/{c}/src"):
        for f in fs:
            if not f.endswith(".rs"): continue
            p = os.path.join(d, f); lines = open(p).read().split("\n")
            test_from = next((i for i, l in enumerate(lines) if re.match(r"\s*#\[cfg\(test\)\]", l)), len(lines))
            for i, l in enumerate(lines):
                m = re.match(r"\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?fn\s+(\w+)", l)
                if not m: continue
                depth, started, j = 0, False, i
                while j < len(lines):
                    s = re.sub(r'"(\\.|[^"\\])*"', '""', re.sub(r"//.*", "", lines[j]))
                    s = re.sub(r"'(\\.|[^'\\])'", "''", s)
                    if not started and ";" in s and "{" not in s: break
                    depth += s.count("{") - s.count("}")
                    if "{" in s: started = True
                    if started and depth <= 0: break
                    j += 1
                n = j - i + 1
                if started and n > limit:
                    reason = any("80 lines" in x or "long:" in x.lower() for x in lines[max(0,i-6):i])
                    print(f"{n:4d} {os.path.relpath(p, root)}:{i+1} {m.group(5)}{' (test)' if i > test_from else ''}{' (reason given)' if reason else ''}")
