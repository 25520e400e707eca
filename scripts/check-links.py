#!/usr/bin/env python3
"""check-links.py --forbid DIR PROG_OBJ OBJ...: fails when a program's object
would link an object under DIR/ (issue 24: crun-rdzvd links nothing from
agent/). The program's undefined symbols (`nm`) pull in the objects of the
list that define them, as the linker would from the archive, and those
objects' undefined symbols pull in more; every object under DIR/ reached
that way is printed with the symbol and the object that wanted it.
"""
import argparse
import collections
import os
import subprocess
import sys


def symbols(obj):
    defined, wanted = set(), set()
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "TDBR":
            defined.add(f[2])
        elif len(f) == 2 and f[0] == "U":
            wanted.add(f[1])
    return defined, wanted


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forbid", required=True, help="a module folder, e.g. agent")
    ap.add_argument("--root", default="", help="the objects' folder (names print relative)")
    ap.add_argument("prog")
    ap.add_argument("objs", nargs="+")
    a = ap.parse_args()
    owner, wants = {}, {}
    for o in [a.prog] + a.objs:
        d, w = symbols(o)
        wants[o] = w
        for s in d:
            owner.setdefault(s, o)
    why, todo = {a.prog: None}, collections.deque([a.prog])
    while todo:
        o = todo.popleft()
        for s in sorted(wants[o]):
            t = owner.get(s)
            if t and t not in why:
                why[t] = (s, o)
                todo.append(t)
    forbid = os.path.join(a.root, a.forbid.strip("/")) + "/"
    bad = sorted(o for o in why if o != a.prog and o.startswith(forbid))
    name = os.path.basename(a.prog)
    for o in bad:
        s, by = why[o]
        print(f"check-links: {name} links {o}: {by} calls {s}")
    if bad:
        print(f"check-links: {name} must link nothing from {a.forbid}/ (issue 24)")
        return 1
    print(f"check-links: ok ({name} links nothing from {a.forbid}/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
