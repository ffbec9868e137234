"""Stand-in of LMCache's lmcache/v1/protocol.py of the dev branch, 2026 (the grouped remote
metadata, as in licheng165/LMCache @d19a2027): init_remote_metadata_info(num_groups) sizes the
header — native ints: length, fmt.value, then per KV group the dtype code and 4 shape dims —
and get_remote_metadata_bytes() tells its size (4 * (2 + 5 * groups)); RemoteMetadata(length,
shapes, dtypes, fmt) refuses to pack before the size is set (an AssertionError) and zips shapes
with dtypes (a single dtype is not iterable: TypeError). Shapes of fewer than 4 dims are padded
with zeros here (upstream's padding has changed between commits)."""

import dataclasses
import struct
from typing import Optional

from lmcache.v1.memory_management import MemoryFormat, bfloat16, float16, uint8

DTYPE_TO_INT = {None: 0, float16: 2, bfloat16: 3, uint8: 6}
INT_TO_DTYPE = {v: k for k, v in DTYPE_TO_INT.items()}
REMOTE_METADATA_FMT: Optional[str] = None
REMOTE_METADATA_BYTES: Optional[int] = None


def init_remote_metadata_info(num_groups: int) -> None:
    global REMOTE_METADATA_FMT, REMOTE_METADATA_BYTES
    REMOTE_METADATA_FMT = "i" * (2 + 5 * num_groups)
    REMOTE_METADATA_BYTES = struct.calcsize(REMOTE_METADATA_FMT)


def get_remote_metadata_bytes() -> int:
    assert REMOTE_METADATA_BYTES is not None
    return REMOTE_METADATA_BYTES


@dataclasses.dataclass
class RemoteMetadata:
    length: int
    shapes: list
    dtypes: list
    fmt: MemoryFormat

    def _ints(self):
        out = [self.length, int(self.fmt.value)]
        for shape, dtype in zip(self.shapes, self.dtypes, strict=True):
            assert len(shape) <= 4, "Shape dimension must be <= 4"
            out.append(DTYPE_TO_INT[dtype])
            out.extend(list(shape) + [0] * (4 - len(shape)))
        return out

    def serialize(self) -> bytes:
        assert REMOTE_METADATA_FMT is not None
        return struct.pack(REMOTE_METADATA_FMT, *self._ints())

    @staticmethod
    def deserialize(s) -> "RemoteMetadata":
        assert REMOTE_METADATA_FMT is not None
        v = struct.unpack_from(REMOTE_METADATA_FMT, s)
        shapes, dtypes = [], []
        for i in range(2, len(v), 5):
            dims = list(v[i + 1:i + 5])
            while len(dims) > 1 and dims[-1] == 0:
                dims.pop()
            shapes.append(tuple(dims))
            dtypes.append(INT_TO_DTYPE[v[i]])
        return RemoteMetadata(v[0], shapes, dtypes, MemoryFormat(v[1]))
