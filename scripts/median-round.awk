# The median round of each target of a bench script (scripts/bench-gateway.sh,
# scripts/bench-service.sh). Reads one line per round, `name|req/s|p50|p99`, and prints each
# name's median round by req/s as `name|req/s|p50|p99| r1 r2 ...` (every round's req/s), in
# the order the names first appear.
BEGIN { FS = "|" }
{
  if (!($1 in n)) order[++k] = $1
  i = ++n[$1]; rps[$1, i] = $2; line[$1, i] = $0; all[$1] = all[$1] " " int($2)
}
END {
  for (j = 1; j <= k; j++) {
    t = order[j]; c = n[t]
    for (a = 1; a <= c; a++) idx[a] = a
    for (a = 1; a <= c; a++) for (b = a + 1; b <= c; b++) if (rps[t, idx[b]] < rps[t, idx[a]]) { x = idx[a]; idx[a] = idx[b]; idx[b] = x }
    print line[t, idx[int((c + 1) / 2)]] "|" all[t]
  }
}
