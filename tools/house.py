#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""house.py - the architecture of src/lib as its own code draws it.

A room is a source file (.c or .h). An arrow A -> B says that A uses B: A
includes B, or the .c file A calls a function that B defines (not static:
a .c file's function, or a static inline in a header). The floors of src/lib's folders,
bottom up: util, codec and formats, store, archive. An arrow runs
back up when it goes from a lower floor to a higher one. A circle is a set
of two rooms or more that reach each other (a strongly connected component
of the graph, headers folded into the .c file of their name where there is
one). A header's arrows are its includes only: it declares, it calls
nothing. The top-level headers (ulpack.h, ulp_int.h, arch_int.h) belong to
no floor. Floors of the graph: the longest chain of arrows of the
condensed graph, plus one.

Usage: python3 tools/house.py [SRC_LIB_DIR] [--json]
"""
import json, os, re, sys

FLOOR = {"util": 0, "codec": 1, "formats": 1, "store": 2, "archive": 3}


def rooms(top):
    out = []
    for d, _, fs in os.walk(top):
        for f in fs:
            if f.endswith((".c", ".h")):
                out.append(os.path.relpath(os.path.join(d, f), top))
    return sorted(out)


def floor(r):
    """The room's floor; None for the top-level headers (every floor's)."""
    if "/" not in r:
        return None
    return FLOOR.get(r.split("/")[0])


def strip(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    top = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "src", "lib")
    # remote_none.c stands in for remote.c and backend_s3.c in a build
    # without libcurl: the same functions, so not rooms of this house
    rs = [r for r in rooms(top) if r != "store/remote_none.c"]
    src = {r: strip(open(os.path.join(top, r), errors="replace").read()) for r in rs}
    raw = {r: open(os.path.join(top, r), errors="replace").read() for r in rs}
    base = {os.path.basename(r): r for r in rs}
    defs = {}
    for r in rs:
        body = src[r]
        for m in re.finditer(r"^(?!static\b)[A-Za-z_][\w \t\*]*?\b(ulp_\w+)\s*\([^;{]*\)\s*\{", body, re.M):
            defs.setdefault(m.group(1), r)
        if r.endswith(".h"):
            for m in re.finditer(r"^static inline [\w \t\*]*?\b(ulp_\w+)\s*\(", body, re.M):
                defs.setdefault(m.group(1), r)
    arrows = set()
    for r in rs:
        for m in re.finditer(r'#include\s+"([^"]+)"', raw[r]):
            inc = m.group(1)
            cand = os.path.normpath(os.path.join(os.path.dirname(r), inc))
            tgt = cand if cand in src else (inc if inc in src else base.get(os.path.basename(inc)))
            if tgt and tgt != r:
                arrows.add((r, tgt))
        if r.endswith(".h"):
            continue  # a header declares; only a .c file's calls are arrows
        for name in set(re.findall(r"\b(ulp_\w+)\s*\(", src[r])):
            t = defs.get(name)
            if t and t != r:
                arrows.add((r, t))
    up = sorted((a, b) for a, b in arrows
                if floor(a) is not None and floor(b) is not None and floor(a) < floor(b))
    # circles: the .c files' graph, a header folded into its .c
    def fold(r):
        if r.endswith(".h") and r[:-2] + ".c" in src:
            return r[:-2] + ".c"
        return r
    g = {}
    for a, b in arrows:
        fa, fb = fold(a), fold(b)
        if fa != fb:
            g.setdefault(fa, set()).add(fb)
    nodes = sorted(set(map(fold, rs)))
    index, low, stack, on, comps = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)
    def sc(v, c=[0]):
        index[v] = low[v] = c[0]; c[0] += 1
        stack.append(v); on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                sc(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))
    for v in nodes:
        if v not in index:
            sc(v)
    circles = [c for c in comps if len(c) > 1]
    comp_of = {v: i for i, c in enumerate(comps) for v in c}
    cg = {}
    for a, bs in g.items():
        for b in bs:
            if comp_of[a] != comp_of[b]:
                cg.setdefault(comp_of[a], set()).add(comp_of[b])
    depth = {}
    def dp(c):
        if c not in depth:
            depth[c] = 1 + max((dp(d) for d in cg.get(c, ())), default=0)
        return depth[c]
    floors = max((dp(c) for c in range(len(comps))), default=0)
    res = {"rooms": len(rs), "floors": floors, "arrows": len(arrows), "back_up": len(up),
           "circles": len(circles), "circle_sizes": [len(c) for c in circles],
           "up": ["%s -> %s" % x for x in up], "circle_rooms": circles}
    if "--json" in sys.argv:
        print(json.dumps(res, indent=1))
    else:
        print("%d rooms, %d floors, %d arrows, %d running back up, %d circles %s" %
              (res["rooms"], floors, len(arrows), len(up), len(circles), res["circle_sizes"]))
        for u in res["up"]:
            print("  up: " + u)
        for c in circles:
            print("  circle: " + " ".join(c))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
