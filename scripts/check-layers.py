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

Usage: check-layers.py [SRC_DIR]   (default: src next to this script's directory)
Prints one line per include that crosses a seam the wrong way, "file:line: ...", and exits 1 if
there is any; 0 when the graph is clean. io/ may not touch a shared struct's fields either
(segment header, control block, process table, any *_sh_t): it goes through shm/ and core/. wire/ may not include a system header of I/O or
shared memory (sockets, mmap, the ring, h2o, nghttp2) either. Includes that name no file of src/ (system headers,
generated headers outside wire/, blake3.h) are not layered.
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


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(here), "src")
    if not os.path.isdir(src):
        print("check-layers: %s is not a directory" % src, file=sys.stderr)
        return 2
    bad = check(src)
    for b in bad:
        print(b)
    if bad:
        print("check-layers: %d include(s) cross a layer seam the wrong way" % len(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
