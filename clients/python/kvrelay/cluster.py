"""
kvrelay.cluster — a fleet of kvrelay nodes behind one client, sharded by rendezvous hashing.

Rendezvous (highest-random-weight) hashing: each key goes to the R nodes whose
hash(node name, key) is highest. Adding or removing one node of N moves only about 1/N of the
keys, and every client that knows the same node names agrees on the owners without any
coordination — the property Dynamo's peer caches and memcached clients rely on. Node names
must be stable (a Kubernetes StatefulSet's pod names are): by default a node's name is its
``host:port``; write ``name=url`` to choose it.

Nodes come from a list (``["http://10.0.0.1:9130", "kv-1=http://kv-1.kv:9130", ...]``) or
from a DNS name that resolves to several addresses (``dns://kv.default.svc:9130``, a
headless Service; re-resolved every ``dns_refresh_s``, each address named ``ip:port``).

Replication: ``replication=R`` writes every key to its R owners and reads from the first
owner that answers. A node that fails at the transport level is marked dead and skipped;
it is re-probed after a back-off that doubles from ``probe_backoff_s`` up to
``max_backoff_s`` (the first request after the back-off is the probe). Reads of a key whose
every owner is dead are misses, never exceptions.

Bounds: at most ``MAX_NODES`` nodes; ``replication`` is clamped to the node count.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import socket
import threading
import time
import urllib.parse
from typing import Callable, Dict, List, Optional, Sequence

from .client import MISS, WRONG_LENGTH, Client, KvCacheStats, byte_view, writable_view

log = logging.getLogger("kvrelay.cluster")

MAX_NODES = 1024


def hrw_score(node_name: str, key) -> int:
    """The rendezvous weight of (node, key): 64 bits of BLAKE2b over both, separated so that
    no (name, key) pair can collide with another by moving bytes across the boundary."""
    h = hashlib.blake2b(digest_size=8)
    h.update(node_name.encode())
    h.update(b"\x00")
    h.update(str(key).encode())
    return int.from_bytes(h.digest(), "big")


def rank_nodes(names: Sequence[str], key, count: int) -> List[int]:
    """Indices of the `count` highest-weight names for key, best first."""
    scored = sorted(((hrw_score(n, key), i) for i, n in enumerate(names)), reverse=True)
    return [i for _, i in scored[:count]]


class Node:
    """One member: its client and its health."""

    def __init__(self, name: str, client: Client, backoff_s: float, max_backoff_s: float):
        self.name = name
        self.client = client
        self._backoff0 = backoff_s
        self._max_backoff = max_backoff_s
        self._backoff = backoff_s
        self._dead_until = 0.0
        self._lock = threading.Lock()
        self.failures = 0  # transport failures seen (observability)

    def usable(self, now: Optional[float] = None) -> bool:
        """Alive, or dead with its back-off over (the next request is the probe)."""
        return (now if now is not None else time.monotonic()) >= self._dead_until

    @property
    def dead(self) -> bool:
        return self._dead_until > time.monotonic()

    def mark_dead(self, exc: BaseException) -> None:
        with self._lock:
            self.failures += 1
            self._dead_until = time.monotonic() + self._backoff
            log.debug("kvrelay node %s marked dead for %.2fs: %s: %s", self.name, self._backoff,
                      type(exc).__name__, exc)
            self._backoff = min(self._backoff * 2, self._max_backoff)

    def mark_alive(self) -> None:
        if self._dead_until or self._backoff != self._backoff0:
            with self._lock:
                self._dead_until = 0.0
                self._backoff = self._backoff0

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.client.url!r}{', dead' if self.dead else ''})"


def _split_spec(spec: str):
    """'name=url' or 'url' -> (name or None, url)."""
    if "=" in spec and "://" not in spec.split("=", 1)[0]:
        name, url = spec.split("=", 1)
        return name.strip(), url.strip()
    return None, spec.strip()


class Cluster:
    """Same API as kvrelay.Client (get/get_into/put/contains/exists/exists_many/delete/stats),
    routed to each key's owners."""

    def __init__(
        self,
        nodes: Optional[Sequence[str]] = None,
        dns: Optional[str] = None,
        replication: int = 1,
        probe_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        dns_refresh_s: float = 30.0,
        resolver: Callable = socket.getaddrinfo,
        **client_kwargs,
    ):
        if (nodes is None) == (dns is None):
            raise ValueError("give exactly one of nodes= or dns=")
        if replication < 1:
            raise ValueError("replication must be >= 1")
        self._client_kwargs = client_kwargs
        self._backoff = (float(probe_backoff_s), float(max_backoff_s))
        self._resolver = resolver
        self._dns = dns
        self._dns_refresh_s = float(dns_refresh_s)
        self._dns_at = 0.0
        self._lock = threading.Lock()
        self._dns_lock = threading.Lock()
        self._nodes: List[Node] = []
        self._names: List[str] = []
        self.replication_wanted = int(replication)
        if nodes is not None:
            specs = [_split_spec(s) for s in nodes]
            self._set_members([(name or self._default_name(url), url) for name, url in specs])
        else:
            self._resolve_dns(force=True)
        self._fanout = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(32, max(2, len(self._nodes))), thread_name_prefix="kvrelay-cluster")
        self.errors = 0

    # -- membership -------------------------------------------------------------------------

    @staticmethod
    def _default_name(url: str) -> str:
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        return f"{u.hostname}:{u.port or 80}"

    def _set_members(self, members):
        if not members:
            raise ValueError("a cluster needs at least one node")
        if len(members) > MAX_NODES:
            raise ValueError(f"at most {MAX_NODES} nodes")
        names = [n for n, _ in members]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate node names in {names}")
        old = {n.name: n for n in self._nodes}
        nodes = []
        for name, url in members:
            node = old.pop(name, None)
            if node is None:
                node = Node(name, Client(url=url, **self._client_kwargs), *self._backoff)
            nodes.append(node)
        with self._lock:
            self._nodes, self._names = nodes, names
        for gone in old.values():
            gone.client.close()

    def _resolve_dns(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._dns_at < self._dns_refresh_s:
            return
        # one resolution at a time; the other threads go on with the current members
        if not self._dns_lock.acquire(blocking=force):
            return
        try:
            self._resolve_dns_locked(now)
        finally:
            self._dns_lock.release()

    def _resolve_dns_locked(self, now: float) -> None:
        force = not self._nodes
        self._dns_at = now
        u = urllib.parse.urlsplit(self._dns if "://" in self._dns else "dns://" + self._dns)
        scheme = "https" if u.scheme == "dnss" else "http"
        port = u.port or 9130
        try:
            infos = self._resolver(u.hostname, port, type=socket.SOCK_STREAM)
        except OSError as e:
            if force and not self._nodes:
                raise
            log.debug("kvrelay dns %s: %s (keeping %d nodes)", self._dns, e, len(self._nodes))
            return
        addrs = sorted({info[4][0] for info in infos})[:MAX_NODES]
        if not addrs:
            if force:
                raise ValueError(f"{self._dns} resolves to no address")
            return  # keep the members: an empty answer is not a fleet of zero
        members = []
        for a in addrs:
            host = f"[{a}]" if ":" in a else a
            members.append((f"{host}:{port}", f"{scheme}://{host}:{port}"))
        self._set_members(members)

    @property
    def connections_opened(self) -> int:
        return sum(n.client.connections_opened for n in self.nodes)

    @property
    def connections_retired(self) -> int:
        """Pooled connections of every node found closed, or idle too long, and not reused."""
        return sum(n.client.connections_retired for n in self.nodes)

    @property
    def resends(self) -> int:
        return sum(n.client.resends for n in self.nodes)

    @property
    def nodes(self) -> List[Node]:
        return list(self._nodes)

    @property
    def replication(self) -> int:
        return min(self.replication_wanted, len(self._nodes))

    def owners(self, key) -> List[Node]:
        """The key's R owners, best first (dead ones included: callers skip them)."""
        if self._dns is not None:
            self._resolve_dns()
        with self._lock:
            nodes, names = self._nodes, self._names
        return [nodes[i] for i in rank_nodes(names, key, self.replication)]

    def owner(self, key) -> Node:
        return self.owners(key)[0]

    # -- routing ----------------------------------------------------------------------------

    def _each_owner(self, key):
        """Usable owners of key, best first."""
        now = time.monotonic()
        return [n for n in self.owners(key) if n.usable(now)]

    def _call(self, node: Node, fn):
        """fn(client) on node; a transport failure marks the node dead and returns _FAILED."""
        try:
            r = fn(node.client)
        except Exception as e:
            node.mark_dead(e)
            return _FAILED
        node.mark_alive()
        return r

    def get(self, key) -> Optional[bytes]:
        for node in self._each_owner(key):
            r = self._call(node, lambda c: c.fetch(key))
            if r is not _FAILED and r is not None:
                return r
        return None

    def get_into(self, key, buffer) -> Optional[int]:
        try:
            views = [writable_view(buffer)]
        except Exception:
            return None
        return self.fetch_into_quiet(key, views)

    def fetch_into_quiet(self, key, views) -> Optional[int]:
        """fetch_into over the owners: bytes received, or None (miss, wrong length, dead)."""
        for node in self._each_owner(key):
            r = self._call(node, lambda c: c.fetch_into(key, views))
            if r is not _FAILED and r >= 0:
                return r
        return None

    def fetch_into(self, key, views) -> int:
        """Raising flavour for the adapters: the byte count, MISS / WRONG_LENGTH, or raises
        ConnectionError when no owner could be reached."""
        code = None
        for node in self._each_owner(key):
            r = self._call(node, lambda c: c.fetch_into(key, views))
            if r is _FAILED:
                continue
            if r >= 0:
                return r
            code = r if code is None or r == WRONG_LENGTH else code
        if code is None:
            raise ConnectionError(f"no owner of {key!r} reachable")
        return code

    def fetch_many_into(self, keys: Sequence, views) -> List[int]:
        """Client.fetch_many_into routed: the keys whose first usable owner is the same node
        go to it in batch requests, nodes in parallel; a key that missed there (or whose node
        failed) is fetched on its own from its other owners (fetch_into). Per key the byte
        count, MISS or WRONG_LENGTH; ConnectionError only when no owner of any key answered."""
        keys = list(keys)
        out = [MISS] * len(keys)
        owners = [self._each_owner(k) for k in keys]
        by_node: Dict[int, List[int]] = {}
        nodes: Dict[int, Node] = {}
        for i, own in enumerate(owners):
            if own:
                by_node.setdefault(id(own[0]), []).append(i)
                nodes[id(own[0])] = own[0]
        futs = {nid: self._fanout.submit(self._call, nodes[nid],
                                         lambda c, idx=idx: c.fetch_many_into([keys[i] for i in idx],
                                                                              [views[i] for i in idx]))
                for nid, idx in by_node.items()}
        reached = False
        retry: List[int] = []
        for nid, fut in futs.items():
            r = fut.result()
            idx = by_node[nid]
            if r is _FAILED:
                retry.extend(idx)
                continue
            reached = True
            for i, n in zip(idx, r):
                out[i] = n
                if n < 0 and len(owners[i]) > 1:
                    retry.append(i)
        for i in sorted(retry):
            for node in owners[i][1:]:
                r = self._call(node, lambda c, i=i: c.fetch_into(keys[i], views[i]))
                if r is _FAILED:
                    continue
                reached = True
                if r >= 0 or out[i] == MISS:
                    out[i] = r
                if r >= 0:
                    break
        if keys and not reached:
            raise ConnectionError("no owner of any key reachable")
        return out

    def get_many_into(self, keys: Sequence, buffers: Sequence) -> List[bool]:
        keys = list(keys)
        try:
            views = [[writable_view(b)] for b in buffers]
            return [n >= 0 for n in self.fetch_many_into(keys, views)]
        except Exception:
            self.errors += 1
            return [False] * len(keys)

    def fetch_with(self, key, reader):
        """Client.fetch_with over the owners; raises ConnectionError when none is reachable."""
        reached = False
        for node in self._each_owner(key):
            r = self._call(node, lambda c: c.fetch_with(key, reader))
            if r is _FAILED:
                continue
            reached = True
            if r is not None:
                return r
        if not reached:
            raise ConnectionError(f"no owner of {key!r} reachable")
        return None

    def probe(self, key) -> bool:
        reached = False
        for node in self._each_owner(key):
            r = self._call(node, lambda c: c.probe(key))
            if r is _FAILED:
                continue
            reached = True
            if r:
                return True
        if not reached:
            raise ConnectionError(f"no owner of {key!r} reachable")
        return False

    def healthy(self) -> bool:
        return any(n.client.healthy() for n in self.nodes)

    def store(self, key, parts, sequence_hash=None) -> int:
        """PUT to every usable owner: the best status (201/200 if any owner took it); raises
        ConnectionError when none could be reached."""
        parts = [byte_view(p) for p in parts]
        owners = self._each_owner(key)
        if len(owners) > 1:  # replicas are written in parallel
            futs = [self._fanout.submit(self._call, n, lambda c: c.store(key, parts, sequence_hash))
                    for n in owners]
            results = [f.result() for f in futs]
        else:
            results = [self._call(n, lambda c: c.store(key, parts, sequence_hash)) for n in owners]
        best = None
        for r in results:
            if r is _FAILED:
                continue
            if best is None or (r in (200, 201) and best not in (200, 201)):
                best = r
        if best is None:
            raise ConnectionError(f"no owner of {key!r} reachable")
        return best

    def put(self, key, value, sequence_hash: Optional[int] = None) -> bool:
        try:
            return self.store(key, [value], sequence_hash) in (200, 201)
        except Exception:
            self.errors += 1
            return False

    def contains(self, key) -> bool:
        for node in self._each_owner(key):
            r = self._call(node, lambda c: c.probe(key))
            if r is True:
                return True
        return False

    def exists(self, key) -> bool:
        return self.contains(key)

    def remove(self, key) -> Optional[int]:
        """DELETE on every usable owner; the references left on the first that had it."""
        out = None
        reached = False
        for node in self._each_owner(key):
            r = self._call(node, lambda c: c.remove(key))
            if r is _FAILED:
                continue
            reached = True
            if out is None and r is not None:
                out = r
        if not reached:
            raise ConnectionError(f"no owner of {key!r} reachable")
        return out

    def delete(self, key) -> Optional[int]:
        try:
            return self.remove(key)
        except Exception:
            self.errors += 1
            return None

    def probe_many(self, keys: Sequence) -> List[bool]:
        """Existence of every key: one batch request per node, nodes in parallel; a key
        missing on its first owner is asked of its next replica. A key no owner answered for is
        False; ConnectionError only when no node answered for any key."""
        keys = list(keys)
        result = [False] * len(keys)
        pending = list(range(len(keys)))
        owners = [self._each_owner(k) for k in keys]
        reached = set()
        for round_ in range(self.replication):
            by_node: Dict[int, List[int]] = {}
            nodes: Dict[int, Node] = {}
            for i in pending:
                if round_ < len(owners[i]):
                    n = owners[i][round_]
                    if n.usable():
                        by_node.setdefault(id(n), []).append(i)
                        nodes[id(n)] = n
                        continue
            if not by_node:
                break
            futs = {nid: self._fanout.submit(self._call, nodes[nid],
                                             lambda c, idx=idx: c.probe_many([keys[i] for i in idx]))
                    for nid, idx in by_node.items()}
            pending = []
            for nid, fut in futs.items():
                r = fut.result()
                idx = by_node[nid]
                if r is _FAILED:
                    pending.extend(idx)
                    continue
                for i, hit in zip(idx, r):
                    reached.add(i)
                    if hit:
                        result[i] = True
                    else:
                        pending.append(i)
            pending.sort()
        if keys and not reached:
            raise ConnectionError("no owner of any key reachable")
        return result

    def exists_many(self, keys: Sequence) -> List[bool]:
        keys = list(keys)
        try:
            return self.probe_many(keys)
        except Exception:
            self.errors += 1
            return [False] * len(keys)

    def stats(self) -> Dict[str, Optional[KvCacheStats]]:
        """Each node's /kv/stats (None for a node that did not answer)."""
        return {n.name: n.client.stats() for n in self.nodes}

    def close(self) -> None:
        self._fanout.shutdown(wait=False)
        for n in self.nodes:
            n.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_FAILED = object()


def make_store(url: Optional[str] = None, nodes=None, dns: Optional[str] = None, replication: int = 1,
               **client_kwargs):
    """A Client for one node, a Cluster for several: what every adapter calls.

    ``url`` may list several nodes separated by commas; ``nodes`` is a list; ``dns`` a name
    resolving to the nodes. One node and no DNS gives a plain Client."""
    if isinstance(nodes, str):
        nodes = [s for s in nodes.split(",") if s.strip()]
    if url and "," in url:
        nodes = [s for s in url.split(",") if s.strip()]
        url = None
    if dns:
        return Cluster(dns=dns, replication=replication, **client_kwargs)
    if nodes and len(nodes) > 1:
        return Cluster(nodes=nodes, replication=replication, **client_kwargs)
    if nodes:
        url = _split_spec(nodes[0])[1]
    return Client(url=url, **client_kwargs)


__all__ = ["Cluster", "Node", "hrw_score", "rank_nodes", "make_store", "MISS", "WRONG_LENGTH"]
