"""Stand-in of LMCache's lmcache/v1/protocol.py @c1a02cc8 (LMCache/LMCache), the part remote
connectors use: RemoteMetadata(length, shape, dtype, fmt), packed as seven native ints —
length, fmt.value, DTYPE_TO_INT[dtype], shape[0..3] — 28 bytes; a shape must have 4 dims."""

import dataclasses
import struct

from lmcache.v1.memory_management import MemoryFormat, bfloat16, float16, uint8

DTYPE_TO_INT = {None: 0, float16: 2, bfloat16: 3, uint8: 6}
INT_TO_DTYPE = {v: k for k, v in DTYPE_TO_INT.items()}
_FMT = "iiiiiii"


@dataclasses.dataclass
class RemoteMetadata:
    length: int
    shape: tuple
    dtype: object
    fmt: MemoryFormat

    def serialize(self) -> bytes:
        assert len(self.shape) == 4, "Shape dimension should be 4"
        return struct.pack(_FMT, self.length, int(self.fmt.value), DTYPE_TO_INT[self.dtype], *self.shape)

    @staticmethod
    def deserialize(s) -> "RemoteMetadata":
        length, fmt, dtype, s0, s1, s2, s3 = struct.unpack_from(_FMT, s)
        return RemoteMetadata(length, (s0, s1, s2, s3), INT_TO_DTYPE[dtype], MemoryFormat(fmt))
