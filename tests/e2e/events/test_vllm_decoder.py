"""
The strict test decoder (vllm_kv_events.py) is itself a judge, so it is checked first: it
takes what vLLM's msgspec structs take (both generations), and refuses, with an exception, what
msgspec's Decoder(KVEventBatch) refuses: a wrong or missing tag, a missing field (an array too
short), a value of the wrong type; with forbid_unknown (the default) also extra trailing
elements and unknown map keys, which msgspec itself would skip (forbid_unknown=False does so).
"""

import msgpack
import pytest

from . import vllm_kv_events as vk

H = 0xFEDCBA9876543210


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


STORED_A = ["BlockStored", [H, b"\x01\x02"], None, [1, 2, 3], 16, None, "CPU", None]
REMOVED_A = ["BlockRemoved", [H], "CPU"]
STORED_M = {"type": "BlockStored", "block_hashes": [H], "parent_block_hash": 5, "token_ids": [],
            "block_size": 256, "lora_id": 3, "medium": None, "lora_name": "l"}
REMOVED_M = {"type": "BlockRemoved", "block_hashes": [H, 7], "medium": "CPU"}


def test_array_form_decoded_field_by_field():
    b = vk.decode_batch(pack([1.25, [["AllBlocksCleared"], STORED_A, REMOVED_A], 0]), "array")
    assert b.ts == 1.25 and b.data_parallel_rank == 0
    assert b.events == [vk.AllBlocksCleared(),
                        vk.BlockStored([H, b"\x01\x02"], None, [1, 2, 3], 16, None, "CPU", None),
                        vk.BlockRemoved([H], "CPU")]
    # data_parallel_rank is optional (default None); an integer ts is taken as a float
    b = vk.decode_batch(pack([7, []]), "array")
    assert b.ts == 7.0 and isinstance(b.ts, float) and b.data_parallel_rank is None and b.events == []


def test_map_form_decoded_field_by_field():
    extra = dict(STORED_M, group_idx=2, extra_keys=[None, ["lora", "x"]], session_id="s")
    b = vk.decode_batch(pack([2.5, [{"type": "AllBlocksCleared"}, STORED_M, REMOVED_M, extra], None]), "map")
    assert b.data_parallel_rank is None
    assert b.events[:3] == [vk.AllBlocksCleared(), vk.BlockStored([H], 5, [], 256, 3, None, "l"),
                            vk.BlockRemoved([H, 7], "CPU")]
    assert b.events[3].group_idx == 2 and b.events[3].extra_keys == [None, ("lora", "x")]


@pytest.mark.parametrize("events, form, why", [
    ([["BlockStore", [1], None, [], 16, None, "CPU", None]], "array", "invalid tag"),
    ([[]], "array", "no tag"),
    ([[b"BlockStored", [1], None, [], 16, None, "CPU", None]], "array", "invalid tag"),
    ([["BlockStored", [1], None, [], 16, None, "CPU"]], "array", "at least 7"),  # lora_name missing
    ([["BlockRemoved", [1]]], "array", "at least 2"),
    ([["BlockStored", [1], None, [], 16, None, "CPU", None, "extra"]], "array", "expected 7"),
    ([["AllBlocksCleared", 1]], "array", "expected 0"),
    ([["BlockStored", 1, None, [], 16, None, "CPU", None]], "array", "expected array"),
    ([["BlockStored", [1.5], None, [], 16, None, "CPU", None]], "array", "ExternalBlockHash"),
    ([["BlockStored", [True], None, [], 16, None, "CPU", None]], "array", "ExternalBlockHash"),
    ([["BlockStored", [1], None, [], 16.0, None, "CPU", None]], "array", "expected int"),
    ([["BlockStored", [1], None, [], True, None, "CPU", None]], "array", "expected int"),
    ([["BlockStored", [1], None, ["a"], 16, None, "CPU", None]], "array", "expected int"),
    ([["BlockStored", [1], None, [], 16, None, 5, None]], "array", "expected str"),
    ([["BlockRemoved", [1], b"CPU"]], "array", "expected str"),
    ([{"type": "BlockStored", "block_hashes": [1]}], "array", "array-like"),  # a map in the array form
    ([STORED_A], "map", "tagged by 'type'"),  # an array in the map form
    ([{"block_hashes": [1], "medium": "CPU"}], "map", "missing the tag"),
    ([{"type": "Nope"}], "map", "invalid tag"),
    ([{"type": "BlockRemoved", "block_hashes": [1]}], "map", "missing required field 'medium'"),
    ([dict(STORED_M, lora_name=1)], "map", "expected str"),
    ([dict(REMOVED_M, surprise=1)], "map", "unknown field"),
    ([dict(STORED_M, group_idx="x")], "map", "expected int"),
])
def test_refused(events, form, why):
    with pytest.raises(vk.KvEventsDecodeError, match=why):
        vk.decode_batch(pack([1.0, events, 0]), form)


@pytest.mark.parametrize("payload, why", [
    (pack({"ts": 1.0, "events": []}), "array-like EventBatch"),
    (pack([1.0]), "at least 2"),
    (pack([1.0, [], 0, 1]), "at most 3"),
    (pack(["1.0", [], 0]), "expected float"),
    (pack([1.0, {}, 0]), "expected array"),
    (pack([1.0, [], 0.0]), "expected int"),
    (pack([1.0, [], 0]) + b"\x00", "not one msgpack value"),
    (b"\xc1", "not one msgpack value"),
])
def test_batch_refused(payload, why):
    with pytest.raises(vk.KvEventsDecodeError, match=why):
        vk.decode_batch(payload, "array")


def test_unknown_skipped_as_msgspec_does_when_asked():
    """forbid_unknown=False: msgspec's default, extra trailing elements and keys skipped."""
    a = vk.decode_batch(pack([1.0, [STORED_A + ["later"]], 0, "x"]), "array", forbid_unknown=False)
    assert a.events[0].block_size == 16
    m = vk.decode_batch(pack([1.0, [dict(REMOVED_M, later=1)], 0]), "map", forbid_unknown=False)
    assert m.events[0] == vk.BlockRemoved([H, 7], "CPU")
