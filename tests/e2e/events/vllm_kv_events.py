"""
A strict decoder of vLLM's KV-event batches, written for the tests from vLLM's own struct
definitions (msgspec Structs in `vllm/distributed/kv_events.py`), so that kvrelay's stream is
judged by what a vLLM consumer would accept, not by kvrelay's own client (kvrelay.events).

Pinned sources (the facts below were read there; no code was taken):

- the array form (`--kv-events-format vllm`): upstream vLLM before vllm-project/vllm PR #42892
  (merged 2026-06-09, which dropped array_like on the events), as read at
  1CatAI/1Cat-vLLM commit 92a785cb21e2b2acbd4be1dfd87e799c9c632a37, file
  vllm/distributed/kv_events.py;
- the map form (`--kv-events-format vllm-map`: events as maps tagged by "type", PR #42892), as
  read at local-inference-lab/vllm commit b6b82137404e5bc1488ebd4ed18b395fe55b2b9f, same file.

The definitions, as msgspec reads them:

    EventBatch(array_like, omit_defaults):  ts: float, events: list,
                                            data_parallel_rank: int | None = None
    KVEventBatch(EventBatch):               events: list[BlockStored | BlockRemoved |
                                                         AllBlocksCleared]
    KVCacheEvent(tag=True; array_like=True in the array form only): the tag is the class name,
        the first element of the array (array form) or the value of "type" (map form)
    BlockStored:  block_hashes: list[ExternalBlockHash], parent_block_hash: ExternalBlockHash |
                  None, token_ids: list[int], block_size: int, lora_id: int | None,
                  medium: str | None, lora_name: str | None   (all required)
        map form only, optional: extra_keys: list[tuple | None] | None, group_idx: int | None,
                  kv_cache_spec_kind: str | None, kv_cache_spec_sliding_window: int | None,
                  locality: str | None, ownership: str | None, session_id: str | None,
                  skipped_parent_block_hash: ExternalBlockHash | None,
                  skipped_token_ids: list[int] | None, skipped_extra_keys: list[tuple | None] | None
    BlockRemoved: block_hashes: list[ExternalBlockHash], medium: str | None   (required)
        map form only, optional: group_idx: int | None, locality: str | None, ownership: str | None
    AllBlocksCleared: no field
    ExternalBlockHash = bytes | int

Strictness: msgspec's Decoder(KVEventBatch) raises on a wrong or missing tag, a missing required
field (an array too short) and a value of the wrong type (an int field takes no bool and no
float; a float field takes an int, as msgspec converts it). msgspec ignores extra trailing array
elements and unknown map keys; this decoder does that too with forbid_unknown=False, and raises
on them with forbid_unknown=True (the default: kvrelay writes exactly the fields above).
Every failure raises KvEventsDecodeError. msgspec is not packaged in Debian 12: this is msgpack
(python3-msgpack) plus the checks.
"""

import dataclasses
from typing import Any, List, Optional, Tuple, Union

import msgpack

ExternalBlockHash = Union[bytes, int]
_ABSENT = object()


class KvEventsDecodeError(ValueError):
    """The payload is not a KVEventBatch as vLLM defines it."""


@dataclasses.dataclass(frozen=True)
class BlockStored:
    block_hashes: List[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    # map form (PR #42892) only; absent = the default None
    extra_keys: Optional[list] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None
    session_id: Optional[str] = None
    skipped_parent_block_hash: Optional[ExternalBlockHash] = None
    skipped_token_ids: Optional[List[int]] = None
    skipped_extra_keys: Optional[list] = None


@dataclasses.dataclass(frozen=True)
class BlockRemoved:
    block_hashes: List[ExternalBlockHash]
    medium: Optional[str]
    group_idx: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class AllBlocksCleared:
    pass


@dataclasses.dataclass(frozen=True)
class KVEventBatch:
    ts: float
    events: List[Union[BlockStored, BlockRemoved, AllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


# -- field types ----------------------------------------------------------------------------


def _fail(where, msg):
    raise KvEventsDecodeError(f"{where}: {msg}")


def _int(v, where):
    if type(v) is not int:
        _fail(where, f"expected int, got {type(v).__name__} {v!r}")
    return v


def _float(v, where):
    if type(v) is float:
        return v
    if type(v) is int:  # msgspec accepts an integer for a float field
        return float(v)
    _fail(where, f"expected float, got {type(v).__name__} {v!r}")


def _str(v, where):
    if type(v) is not str:
        _fail(where, f"expected str, got {type(v).__name__} {v!r}")
    return v


def _hash(v, where):
    if type(v) is int or type(v) is bytes:
        return v
    _fail(where, f"expected bytes | int (ExternalBlockHash), got {type(v).__name__} {v!r}")


def _optional(inner):
    def check(v, where):
        return None if v is None else inner(v, where)
    return check


def _list_of(inner):
    def check(v, where):
        if type(v) is not list:
            _fail(where, f"expected array, got {type(v).__name__} {v!r}")
        return [inner(x, f"{where}[{i}]") for i, x in enumerate(v)]
    return check


def _tuple_or_none(v, where):
    if v is None or type(v) is list:  # tuple[Any, ...] | None: an array of anything
        return None if v is None else tuple(v)
    _fail(where, f"expected array | None, got {type(v).__name__}")


_hash_list = _list_of(_hash)
_int_list = _list_of(_int)
_extra_keys = _optional(_list_of(_tuple_or_none))

# (name, check, required) in declaration order
_STORED_FIELDS = (
    ("block_hashes", _hash_list, True),
    ("parent_block_hash", _optional(_hash), True),
    ("token_ids", _int_list, True),
    ("block_size", _int, True),
    ("lora_id", _optional(_int), True),
    ("medium", _optional(_str), True),
    ("lora_name", _optional(_str), True),
)
_STORED_MAP_EXTRA = (
    ("extra_keys", _extra_keys, False),
    ("group_idx", _optional(_int), False),
    ("kv_cache_spec_kind", _optional(_str), False),
    ("kv_cache_spec_sliding_window", _optional(_int), False),
    ("locality", _optional(_str), False),
    ("ownership", _optional(_str), False),
    ("session_id", _optional(_str), False),
    ("skipped_parent_block_hash", _optional(_hash), False),
    ("skipped_token_ids", _optional(_int_list), False),
    ("skipped_extra_keys", _extra_keys, False),
)
_REMOVED_FIELDS = (
    ("block_hashes", _hash_list, True),
    ("medium", _optional(_str), True),
)
_REMOVED_MAP_EXTRA = (
    ("group_idx", _optional(_int), False),
    ("locality", _optional(_str), False),
    ("ownership", _optional(_str), False),
)

ARRAY_FORM = {
    "BlockStored": (BlockStored, _STORED_FIELDS),
    "BlockRemoved": (BlockRemoved, _REMOVED_FIELDS),
    "AllBlocksCleared": (AllBlocksCleared, ()),
}
MAP_FORM = {
    "BlockStored": (BlockStored, _STORED_FIELDS + _STORED_MAP_EXTRA),
    "BlockRemoved": (BlockRemoved, _REMOVED_FIELDS + _REMOVED_MAP_EXTRA),
    "AllBlocksCleared": (AllBlocksCleared, ()),
}


# -- events ---------------------------------------------------------------------------------


def decode_array_event(v, where="event", forbid_unknown=True):
    """One event of the array form: [tag, field, ...] in declaration order."""
    if type(v) is not list:
        _fail(where, f"expected an array-like tagged struct, got {type(v).__name__} {v!r}")
    if not v:
        _fail(where, "empty array: no tag")
    tag = v[0]
    if type(tag) is not str or tag not in ARRAY_FORM:
        _fail(where, f"invalid tag {tag!r}")
    cls, fields = ARRAY_FORM[tag]
    values = v[1:]
    required = sum(1 for f in fields if f[2])
    if len(values) < required:
        _fail(where, f"{tag}: expected at least {required} fields after the tag, got {len(values)}")
    if len(values) > len(fields) and forbid_unknown:
        _fail(where, f"{tag}: expected {len(fields)} fields after the tag, got {len(values)}")
    kw = {}
    for (name, check, _req), value in zip(fields, values):
        kw[name] = check(value, f"{where}.{tag}.{name}")
    return cls(**kw)


def decode_map_event(v, where="event", forbid_unknown=True):
    """One event of the map form: {"type": tag, field: value, ...}."""
    if type(v) is not dict:
        _fail(where, f"expected a map tagged by 'type', got {type(v).__name__} {v!r}")
    tag = v.get("type", _ABSENT)
    if tag is _ABSENT:
        _fail(where, "missing the tag field 'type'")
    if type(tag) is not str or tag not in MAP_FORM:
        _fail(where, f"invalid tag {tag!r}")
    cls, fields = MAP_FORM[tag]
    known = {"type"} | {f[0] for f in fields}
    for k in v:
        if type(k) is not str:
            _fail(where, f"{tag}: a key that is not a str: {k!r}")
        if k not in known and forbid_unknown:
            _fail(where, f"{tag}: unknown field {k!r}")
    kw = {}
    for name, check, required in fields:
        value = v.get(name, _ABSENT)
        if value is _ABSENT:
            if required:
                _fail(where, f"{tag}: missing required field {name!r}")
            continue
        kw[name] = check(value, f"{where}.{tag}.{name}")
    return cls(**kw)


def decode_batch(payload, form="array", forbid_unknown=True):
    """KVEventBatch of one payload; form "array" (vLLM before PR #42892) or "map" (after)."""
    if form not in ("array", "map"):
        raise ValueError(f"form {form!r}")
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except Exception as e:
        raise KvEventsDecodeError(f"payload: not one msgpack value: {type(e).__name__}: {e}") from e
    if type(obj) is not list:
        _fail("batch", f"expected an array-like EventBatch, got {type(obj).__name__}")
    if len(obj) < 2:
        _fail("batch", f"EventBatch: expected at least 2 fields (ts, events), got {len(obj)}")
    if len(obj) > 3 and forbid_unknown:
        _fail("batch", f"EventBatch: expected at most 3 fields, got {len(obj)}")
    ts = _float(obj[0], "batch.ts")
    if type(obj[1]) is not list:
        _fail("batch.events", f"expected array, got {type(obj[1]).__name__}")
    one = decode_array_event if form == "array" else decode_map_event
    events = [one(e, f"batch.events[{i}]", forbid_unknown) for i, e in enumerate(obj[1])]
    rank = _optional(_int)(obj[2], "batch.data_parallel_rank") if len(obj) > 2 else None
    return KVEventBatch(ts, events, rank)


def event_hashes(ev) -> Tuple[Any, ...]:
    return tuple(getattr(ev, "block_hashes", ()))
