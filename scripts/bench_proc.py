#!/usr/bin/python3
"""bench_proc.py — what scripts/bench-dataplane.sh reads from /proc about a server's process tree,
in one place (the pipeline had it twice, and the peers pipeline a third time).

    bench_proc.py cpu PID    "TICKS PUB_TICKS": CPU clock ticks of PID and every process under it,
                             utime+stime of the live ones plus cutime+cstime (children already
                             reaped: kvrelay is a supervisor with worker children); then, after a
                             space, the same over the processes that call themselves the publisher
                             (0 for other servers)
    bench_proc.py tree PID   PID and every process under it, comma-separated (perf -p, strace -p)
"""
import os
import sys


def scan():
    """{pid: (ppid, ticks, comm)} of every process readable now."""
    procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            comm, rest = open(f"/proc/{d}/stat").read().rsplit(")", 1)
        except OSError:
            continue
        f = rest.split()
        procs[int(d)] = (int(f[1]), int(f[11]) + int(f[12]) + int(f[13]) + int(f[14]), comm)
    return procs


def subtree(procs, root):
    kids = {}
    for pid, (ppid, _, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], [(root, 0)]
    while todo:
        pid, depth = todo.pop()
        out.append(pid)
        if depth < 8:
            todo.extend((c, depth + 1) for c in kids.get(pid, []))
    return out


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("cpu", "tree"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    procs, root = scan(), int(sys.argv[2])
    pids = subtree(procs, root)
    if sys.argv[1] == "tree":
        print(",".join(map(str, pids)))
        return 0
    total = sum(procs[p][1] for p in pids if p in procs)
    pub = sum(procs[p][1] for p in pids if p in procs and "publisher" in procs[p][2])
    print(total, pub)
    return 0


if __name__ == "__main__":
    sys.exit(main())
