#!/usr/bin/env python3
"""check-cycles.py [--max N] [--allow DIR=SIZE ...] OBJ...: fails when source
files call each other in a loop of more than N files (issue 24: "no cycle of
more than 4 files"). A call is an undefined symbol of one object that another
object of the list defines (`nm`); a loop is a strongly connected group of
that call graph, so two files that call each other count 2, and a ring of
seven counts 7 even when each file calls only the next.

--allow DIR=SIZE names a known larger group (all its files under DIR/) and
its size today: the check still fails when that group grows past SIZE, so
the exception can only shrink. Every group over N is printed with its files.
"""
import argparse
import collections
import os
import subprocess
import sys


def call_graph(objs):
    defined, wanted = {}, collections.defaultdict(set)
    for o in objs:
        out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBR":
                defined[f[2]] = o
            elif len(f) == 2 and f[0] == "U":
                wanted[o].add(f[1])
    return {o: {defined[s] for s in wanted[o] if s in defined and defined[s] != o}
            for o in objs}


def groups(graph):
    """Strongly connected groups of more than one file (Tarjan, iterative)."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = n
        n += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    g = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        g.append(x)
                        if x == v:
                            break
                    if len(g) > 1:
                        out.append(sorted(g))
            elif w not in index:
                index[w] = low[w] = n
                n += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", type=int, default=4)
    ap.add_argument("--allow", action="append", default=[], metavar="DIR=SIZE")
    ap.add_argument("--root", default="", help="prefix stripped from the names printed")
    ap.add_argument("objs", nargs="+")
    a = ap.parse_args()
    allow = {}
    for spec in a.allow:
        d, _, size = spec.partition("=")
        allow[d.rstrip("/") + "/"] = int(size)
    bad = 0
    for g in groups(call_graph(a.objs)):
        names = [os.path.relpath(o, a.root)[:-2] if a.root else o for o in g]
        if len(g) <= a.max:
            continue
        dirs = {n.rsplit("/", 1)[0] + "/" for n in names}
        limit = allow.get(dirs.pop()) if len(dirs) == 1 else None
        verdict = ("allowed, may only shrink" if limit is not None and len(g) <= limit
                   else "FAILS")
        print(f"check-cycles: {len(g)} files call each other in a loop ({verdict}): "
              + " ".join(names))
        bad |= verdict == "FAILS"
    if not bad:
        print(f"check-cycles: ok (no loop over {a.max} files"
              + (f" but {', '.join(f'{d}<={n}' for d, n in allow.items())})" if allow else ")"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
