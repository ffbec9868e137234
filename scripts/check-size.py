#!/usr/bin/python3
"""
check-size.py — the rooms stay small: no C file over --max-file lines (800) and no function over
--max-func lines (120) unless the comment just above the function says why it is long (it must
contain the word "long"). Functions are found by their braces at column 0, the tree's style: a
definition's "{" and "}" stand alone at the start of a line.

Usage: check-size.py [--max-file N] [--max-func N] DIR|FILE...   exit 1 and one line per excess
"""
import os
import re
import sys


def functions(lines):
    """Yields (name, first_line, last_line, comment_above) for every definition."""
    i = 0
    while i < len(lines):
        if lines[i].rstrip() == "{":
            j = i - 1
            while j >= 0 and lines[j].strip() and not lines[j].rstrip().endswith((";", "}", "*/")):
                j -= 1
            head = " ".join(l.strip() for l in lines[j + 1:i])
            m = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", head)
            end = i + 1
            while end < len(lines) and not lines[end].startswith("}"):
                end += 1
            k, comment = j, []
            if k >= 0 and lines[k].rstrip().endswith("*/"):
                while k >= 0:
                    comment.insert(0, lines[k])
                    if "/*" in lines[k]:
                        break
                    k -= 1
            if m and "=" not in head.split("(")[0]:
                yield m.group(1), j + 2, end + 1, " ".join(comment)
            i = end
        i += 1


def main(argv):
    max_file, max_func, dirs = 800, 120, []
    it = iter(argv)
    for a in it:
        if a == "--max-file":
            max_file = int(next(it))
        elif a == "--max-func":
            max_func = int(next(it))
        else:
            dirs.append(a)
    bad = []
    for d in dirs:
        walk = [(os.path.dirname(d), None, [os.path.basename(d)])] if os.path.isfile(d) else os.walk(d)
        for root, _, files in walk:
            for f in sorted(files):
                if not f.endswith((".c", ".h")):
                    continue
                p = os.path.join(root, f)
                lines = open(p, encoding="utf-8", errors="replace").read().split("\n")
                if len(lines) - 1 > max_file:
                    bad.append(f"{p}: {len(lines) - 1} lines (at most {max_file})")
                if not f.endswith(".c"):
                    continue
                for name, a, b, comment in functions(lines):
                    n = b - a + 1
                    if n > max_func and not re.search(r"\blong\b", comment, re.I):
                        bad.append(f"{p}:{a}: {name}() is {n} lines (at most {max_func} without a"
                                   " comment above it saying why it is long)")
    for b in bad:
        print("check-size: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
