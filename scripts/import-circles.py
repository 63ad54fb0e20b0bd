#!/usr/bin/env python3
"""Import circles between files of the product crates (every crate but sluice-testkit).

Usage: scripts/import-circles.py [ROOT]   (ROOT: the workspace, default .)

Reads `use crate::` / `use super::` / `use self::` lines and inline `crate::a::b` paths of
each crate's src/ (test modules after `#[cfg(test)] mod tests {` left out), follows `pub use`
re-exports to the file that defines a name, and prints each group of files that use each
other around a circle, with its edges. A text reading, not the compiler's: a line it cannot
parse is passed over. Prints nothing when there is no circle."""
import os, re, sys, collections
root = sys.argv[1] if len(sys.argv) > 1 else "."
crates = [c for c in sorted(os.listdir(f"{root}/crates")) if c not in ("sluice-testkit",)]
def modpath(src, f):
    rel = os.path.relpath(f, src)[:-3].split("/")
    if rel[-1] in ("mod", "lib", "main"): rel = rel[:-1]
    return tuple(rel)
for c in crates:
    src = f"{root}/crates/{c}/src"
    if not os.path.isdir(src): continue
    files = {}
    for d, _, fs in os.walk(src):
        for f in fs:
            if f.endswith(".rs"): files[modpath(src, os.path.join(d, f))] = os.path.join(d, f)
    reexp = {}
    for m, f in files.items():
        t = re.sub(r"//[^\n]*", "", open(f).read())
        for u in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", t):
            b = u.group(1).replace("\n", "").replace(" ", "")
            mm = re.match(r"^(.*?)::\{(.*)\}$", b)
            if mm: pre, names = mm.group(1), [x for x in re.split(r",", mm.group(2)) if x and "{" not in x and "}" not in x]
            else:
                pre, _, n = b.rpartition("::"); names = [n]
            segs = pre.split("::")
            if segs[0] == "crate": base = segs[1:]
            elif segs[0] == "super": base = list(m[:-1]) + segs[1:]
            elif segs[0] == "self": base = list(m) + segs[1:]
            else: base = list(m) + segs
            for n in names:
                n = n.split("::")[-1]
                reexp[(m, re.sub(r"\bas\w+$", "", n))] = base
    def resolve(path, depth=0):
        # longest prefix that is a file module, following re-exports of the next name
        for i in range(len(path), -1, -1):
            if tuple(path[:i]) in files:
                m = tuple(path[:i])
                if i < len(path) and (m, path[i]) in reexp and depth < 5:
                    r = resolve(list(reexp[(m, path[i])]) + list(path[i:]), depth + 1)
                    if r: return r
                return m
        return ()
    edges = collections.defaultdict(set)
    for m, f in files.items():
        text = open(f).read()
        # strip test modules crudely: stop at #[cfg(test)] mod tests {
        cut = re.search(r"#\[cfg\(test\)\]\s*mod tests\s*\{", text)
        if cut: text = text[:cut.start()]
        text = re.sub(r"//[^\n]*", "", text)
        inline = [x.group(0) for x in re.finditer(r"(?<![\w:])(?:crate|super)(?:::(?:super|\w+))+", re.sub(r"\buse\s+[^;]+;", "", text))]
        uses = list(re.finditer(r"(?<!pub )(?<!\) )\buse\s+([^;]+);", text)) if m == () else list(re.finditer(r"\buse\s+([^;]+);", text))
        for u in uses + [None]:
            if u is None:
                body = "self::__none__"
            else:
                body = u.group(1).replace("\n", " ").replace(" ", "")
            # expand braces one level at a time
            def expand(s):
                mm = re.match(r"^(.*?)\{(.*)\}$", s)
                if not mm: return [s]
                pre, inner = mm.group(1), mm.group(2)
                parts, depth, cur = [], 0, ""
                for ch in inner:
                    if ch == "{": depth += 1
                    if ch == "}": depth -= 1
                    if ch == "," and depth == 0: parts.append(cur); cur = ""
                    else: cur += ch
                if cur: parts.append(cur)
                out = []
                for p in parts: out += expand(pre + p)
                return out
            for p in expand(body) + inline:
                p = re.sub(r"\bas\s*\w+$", "", p)
                segs = [s for s in p.split("::") if s]
                if not segs: continue
                if segs[0] == "crate": tgt = segs[1:]
                elif segs[0] == "super":
                    base = list(m if not files[m].endswith(("mod.rs",)) and m != () else m)
                    # super relative to module m: parent of m
                    base = list(m[:-1]); segs = segs[1:]
                    while segs and segs[0] == "super": base = base[:-1]; segs = segs[1:]
                    tgt = base + segs
                elif segs[0] == "self":
                    tgt = list(m) + segs[1:]
                else: continue
                t = resolve(tgt)
                if t != m and (t or True) and not (len(m) > 0 and t == m[:len(t)] and False): edges[m].add(t)
    # Tarjan
    idx, low, st, on, out, n = {}, {}, [], set(), [], [0]
    def sc(v):
        idx[v] = low[v] = n[0]; n[0] += 1; st.append(v); on.add(v)
        for w in edges.get(v, ()):
            if w not in idx: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(comp)
    sys.setrecursionlimit(10000)
    for v in list(files): 
        if v not in idx: sc(v)
    for comp in out:
        names = sorted("/".join(x) or "lib" for x in comp)
        print(f"{c}: cycle among {names}")
        for a in comp:
            for b in edges[a]:
                if b in comp: print(f"    {'/'.join(a) or 'lib'} -> {'/'.join(b) or 'lib'}")
