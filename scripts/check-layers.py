#!/usr/bin/python3
"""check-layers.py — the include graph of src/ has no cycles: a layer includes only itself and
the layers below it. Run by `make check-layers` (and so by `make test`).

    base   log, clock, atomics, process titles; src/common.h counts as base
    shm    the shared segment's structures            (may not include wire)
    wire   pure codecs: no I/O, no shared memory      (may not include shm)
    core   the store, the relay state, configuration
    io     sockets, the ring, HTTP and gRPC servers
    proc   supervisor, worker, publisher entry points: the only places that wire modules together
    main   the programs

Prints one line per include that crosses a seam the wrong way, "file:line: ...", and exits 1 if
there is any; 0 when the graph is clean. io/ may not touch a shared struct's fields either
(segment header, control block, process table, any *_sh_t): it goes through shm/ and core/. wire/ may not include a system header of I/O or
shared memory (sockets, mmap, the ring, h2o, nghttp2) either. Includes that name no file of src/ (system headers,
generated headers outside wire/, blake3.h) are not layered.

Circles: no module may depend on itself through others (refused in src/, tools/ and bench/;
src/'s layers order its directories, and --circles also refuses a circle inside one layer).
A module is a .c file and the header of the same name (tools: also X_*.c that share the
private header X_int.h: one module split over several files). Module A depends on module B when
a file of A includes a header of B, or includes a header that declares a function or variable B
defines (a header that declares another module's symbols hands that dependency to everyone who
includes it). Each circle is printed with the include or declaration behind every step.

Usage: check-layers.py [SRC_DIR]                 the layers of SRC_DIR (default: src/ next to
                                                 this script's directory)
       check-layers.py --circles [--src SRC] DIR...   circles in the DIRs together (tools/,
                                                 bench/); headers are looked up next to the
                                                 including file, then in SRC
       check-layers.py --circles-note [--src SRC] DIR...   the same, printed as notes, exit 0
"""
import os
import re
import sys

RANK = {"base": 0, "shm": 1, "wire": 1, "core": 2, "io": 3, "proc": 4, "main": 5}
ORDER = "base < shm, wire < core < io < proc < main"

# The remaining exceptions, each with its reason. Empty the list as they are fixed; the checker
# never allows anything else.
EXCEPTIONS = set()

# io/ reaches shared memory only through the APIs of shm/ and core/ (docs/concurrency.md: one
# owner per shared object): no segment header or control block, no process table, no *_sh_t.
IO_NO_SHARED = re.compile(r'->hdr->|\bhdr->ctl\b|->ctl\.|->procs\[|\b\w+_sh_t\b|->sh->|->sh\b')

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SYSTEM = re.compile(r'^\s*#\s*include\s*<([^>]+)>')
# wire/ is pure codecs: none of the headers through which I/O or shared memory is done.
WIRE_NO_SYSTEM = {"unistd.h", "fcntl.h", "poll.h", "sys/socket.h", "sys/mman.h", "sys/epoll.h",
                  "sys/eventfd.h", "sys/uio.h", "netinet/in.h", "liburing.h", "h2o.h",
                  "nghttp2/nghttp2.h"}


def layer_of_path(rel):
    """Layer of a file under src/ given as a path relative to src/."""
    parts = rel.split("/")
    if len(parts) == 1:
        return "base"  # src/common.h
    return parts[0] if parts[0] in RANK else None


def layer_of_include(src, rel_dir, name):
    # A quoted include is looked up next to the including file first, as the compiler does.
    local = os.path.normpath(os.path.join(rel_dir, name))
    if os.path.exists(os.path.join(src, local)):
        return layer_of_path(local)
    first = name.split("/")[0]
    if "/" in name and first in RANK:
        return first  # -Isrc (or -I$(BUILD)/gen for wire/*.pb-c.h)
    if os.path.exists(os.path.join(src, name)):
        return layer_of_path(name)
    return None


def allowed(frm, to):
    return frm == to or RANK[to] < RANK[frm]


def check(src):
    bad = []
    for dirpath, _, files in sorted(os.walk(src)):
        for fn in sorted(files):
            if not fn.endswith((".c", ".h")):
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, src)
            frm = layer_of_path(rel)
            if frm is None:
                bad.append("%s:1: %s is in no layer (%s)" % (os.path.join(src, rel), rel, ORDER))
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    if frm == "io" and IO_NO_SHARED.search(line.split("//")[0]):
                        bad.append("%s:%d: io touches a shared struct (%s): use the owner's API"
                                   % (os.path.join(src, rel), lineno, IO_NO_SHARED.search(line).group(0)))
                        continue
                    m = SYSTEM.match(line)
                    if m and frm == "wire" and m.group(1) in WIRE_NO_SYSTEM:
                        bad.append("%s:%d: wire includes <%s>: wire is pure codecs, no I/O and no shared memory"
                                   % (os.path.join(src, rel), lineno, m.group(1)))
                        continue
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    to = layer_of_include(src, os.path.dirname(rel), m.group(1))
                    if to is None or allowed(frm, to) or (rel, m.group(1)) in EXCEPTIONS:
                        continue
                    why = "%s is not below %s" % (to, frm)
                    if RANK[to] == RANK[frm]:
                        why = "%s and %s are side by side: neither includes the other" % (frm, to)
                    bad.append('%s:%d: %s includes "%s": %s (%s)'
                               % (os.path.join(src, rel), lineno, frm, m.group(1), why, ORDER))
    return bad


# ---------------------------------------------------------------- circles

# Symbols with external linkage, at column 0 (the tree's style: return type and name on one
# line, the opening brace of a function on a line of its own).
DEF_START = re.compile(r'^(?!static\b|extern\b|typedef\b|return\b|struct\s+\w+\s*\{|enum\b|union\b|#)'
                       r'[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*(\(|\[|=|;)')
DECL_FUNC = re.compile(r'^(?!static\b|typedef\b|return\b|#|struct\s+\w+\s*\{|enum\b|union\b)'
                       r'(?:extern\s+)?[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\(')
DECL_VAR = re.compile(r'^extern\s+[\w \t\*]*?\b([A-Za-z_]\w*)\s*(\[[^\]]*\])*\s*;')
C_KEYWORDS = {"if", "while", "for", "switch", "sizeof", "return", "defined"}


def _statement(lines, i):
    """The text from line i up to the first ';' or '{' (a declaration, or a definition's head)."""
    out = []
    for line in lines[i:i + 12]:
        out.append(line.split("//")[0])
        if ";" in line or "{" in line:
            break
    return " ".join(out)


def defined_symbols(path):
    """Functions and variables with external linkage that the .c file at path defines."""
    syms = set()
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        m = DEF_START.match(line)
        if not m or m.group(1) in C_KEYWORDS:
            continue
        st = _statement(lines, i)
        semi, brace = st.find(";"), st.find("{")
        if m.group(2) == "(":
            if brace >= 0 and (semi < 0 or brace < semi):
                syms.add(m.group(1))  # a function definition
        else:
            syms.add(m.group(1))  # a variable: int x; int x = ...; T x[N] = {...};
    return syms


def declared_symbols(path):
    """Functions (prototypes) and extern variables that the header at path declares: {name: line}."""
    syms = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        m = DECL_VAR.match(line)
        if m:
            syms.setdefault(m.group(1), i + 1)
            continue
        m = DECL_FUNC.match(line)
        if not m or m.group(1) in C_KEYWORDS:
            continue
        st = _statement(lines, i)
        semi, brace = st.find(";"), st.find("{")
        if semi >= 0 and (brace < 0 or semi < brace):
            syms.setdefault(m.group(1), i + 1)
    return syms


def module_of(path):
    """A module: directory and stem; X_*.c/.h beside a private header X_int.h are module X."""
    d, fn = os.path.split(path)
    stem = os.path.splitext(fn)[0]
    if "_" in stem:
        prefix = stem.split("_")[0]
        if os.path.exists(os.path.join(d, prefix + "_int.h")):
            stem = prefix
    return os.path.join(d, stem)


def resolve_include(path, name, src):
    for base in (os.path.dirname(path), src):
        cand = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(cand):
            return cand
    return None


def find_circles(dirs, src):
    """Circles in the module graph of the C files under dirs; one message per circle."""
    files = []
    for top in dirs:
        for dirpath, _, fns in sorted(os.walk(top)):
            files += [os.path.join(dirpath, fn) for fn in sorted(fns) if fn.endswith((".c", ".h"))]
    definer = {}
    for path in files:
        if path.endswith(".c"):
            for sym in defined_symbols(path):
                definer.setdefault(sym, path)
    edges = {}  # module -> {module: why}
    declared_cache = {}

    def add(a, b, why):
        if a != b:
            edges.setdefault(a, {}).setdefault(b, why)

    for path in files:
        mod = module_of(path)
        edges.setdefault(mod, {})
        if path.endswith(".h"):
            for sym, line in sorted(declared_symbols(path).items()):
                if sym in definer:
                    add(mod, module_of(definer[sym]), "%s:%d declares %s, defined in %s"
                        % (path, line, sym, definer[sym]))
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                hdr = resolve_include(path, m.group(1), src)
                if hdr is None:
                    continue
                add(mod, module_of(hdr), '%s:%d includes "%s"' % (path, lineno, m.group(1)))
                if hdr not in declared_cache:
                    declared_cache[hdr] = declared_symbols(hdr)
                for sym, line in sorted(declared_cache[hdr].items()):
                    if sym in definer:
                        add(mod, module_of(definer[sym]), '%s:%d includes "%s", which declares %s (%s:%d), defined in %s'
                            % (path, lineno, m.group(1), sym, hdr, line, definer[sym]))
    # Strongly connected components (Tarjan); every component of two or more modules is a circle.
    index, low, stack, on, comps = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    bad = []
    for comp in comps:
        # one cycle through the component, from its first module, by breadth-first search back to it
        start, members = comp[0], set(comp)
        prev, todo, cycle = {start: None}, [start], None
        while todo and cycle is None:
            nxt = []
            for v in todo:
                for w in sorted(edges.get(v, {})):
                    if w not in members:
                        continue
                    if w == start:
                        cycle = (v, prev)
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if cycle:
                    break
            todo = nxt
        last, prev = cycle
        path = [last]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        path.reverse()
        path.append(start)
        steps = ["    %s -> %s: %s" % (a, b, edges[a][b]) for a, b in zip(path, path[1:])]
        bad.append("include circle among %s:\n%s" % (", ".join(comp), "\n".join(steps)))
    return bad


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    args = sys.argv[1:]
    src = os.path.join(os.path.dirname(here), "src")
    if args[:1] in (["--circles"], ["--circles-note"]):
        note, dirs = args[0] == "--circles-note", args[1:]
        if dirs[:1] == ["--src"]:
            src, dirs = dirs[1], dirs[2:]
        for d in dirs + [src]:
            if not os.path.isdir(d):
                print("check-layers: %s is not a directory" % d, file=sys.stderr)
                return 2
        bad = find_circles(dirs, src)
        if note:
            for b in bad:
                print("check-layers: note: " + b)
            return 0
    else:
        src = args[0] if args else src
        if not os.path.isdir(src):
            print("check-layers: %s is not a directory" % src, file=sys.stderr)
            return 2
        bad = check(src)
    for b in bad:
        print(b)
    if bad:
        print("check-layers: %d include(s) cross a layer seam the wrong way or form a circle" % len(bad),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
