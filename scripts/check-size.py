#!/usr/bin/env python3
"""check-size.py [--max-function N] [--max-file N] FILE...: fails when a
production source file is longer than --max-file lines or one of its
functions has a body longer than --max-function lines (issue 24: "no
function over 100 lines and no production file over 1,000 lines").

A function is found as the project's style writes it (STYLE.md, the kernel's
layout): its opening brace alone at column 0, its closing brace at column 0;
the name is the line before the brace that holds the "(". Initialisers such as
`static const struct x t[] = {` end in "{" on their own line and are not
counted. Every offender is printed with its length, so the failure says where.
"""
import argparse
import sys


def functions(lines):
    start = None
    for i, line in enumerate(lines):
        if line.startswith("{"):
            start = i
        elif line.startswith("}") and start is not None:
            j = start - 1
            while j > 0 and "(" not in lines[j]:
                j -= 1
            name = lines[j].split("(")[0].split()[-1].lstrip("*") if j >= 0 else "?"
            yield name, start + 1, i - start - 1
            start = None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-function", type=int, default=100)
    ap.add_argument("--max-file", type=int, default=1000)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    bad, longest = [], []
    for path in a.files:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if len(lines) - 1 > a.max_file:
            bad.append(f"{path}: {len(lines) - 1} lines (at most {a.max_file})")
        for name, line, body in functions(lines):
            longest.append((body, f"{path}:{line} {name}"))
            if body > a.max_function:
                bad.append(f"{path}:{line}: {name} has {body} lines (at most {a.max_function})")
    for b in bad:
        print("check-size:", b, file=sys.stderr)
    if bad:
        return 1
    longest.sort(reverse=True)
    print(f"check-size: {len(a.files)} files; longest functions: "
          + ", ".join(f"{where} {n}" for n, where in longest[:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
