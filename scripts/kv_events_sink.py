#!/usr/bin/env python3
"""kv_events_sink.py — a KV events subscriber for the benchmarks (scripts/bench-kv-events.sh).

    kv_events_sink.py ENDPOINT                 read and count every message until SIGTERM
    kv_events_sink.py --never-read ENDPOINT    subscribe, then never read (a stuck router)

Subscribes to every kv@ topic of kvrelay's --kv-events-bind. On SIGTERM prints the messages
and bytes it read.
"""
import signal
import sys
import time

import zmq


def main():
    args = sys.argv[1:]
    never = args and args[0] == "--never-read"
    if never:
        args = args[1:]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(args[0])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    msgs = size = 0
    while not stop:
        if never:
            time.sleep(0.1)  # holding the subscription, reading nothing
            continue
        if sub.poll(100):
            while True:
                try:
                    frames = sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                msgs += 1
                size += sum(len(f) for f in frames)
    print(f"kv_events_sink: {msgs} messages, {size} bytes read")
    sub.close(linger=0)
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
