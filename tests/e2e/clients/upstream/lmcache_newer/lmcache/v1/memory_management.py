"""Stand-in of LMCache's lmcache/v1/memory_management.py as the newer remote connectors meet it
(the dev branch of 2026, base_connector.py @2f0c2f22's era): MemoryFormat, and a MemoryObj that
may hold several KV groups — get_shapes() / get_dtypes() (one per group), get_memory_format(),
byte_array, meta.shape / meta.shapes, raw_data, ref_count_down. Member values are this
stand-in's; DType replaces torch's dtypes."""

import enum


class DType:
    def __init__(self, name, itemsize):
        self.name = name
        self.itemsize = itemsize

    def __repr__(self):
        return f"DType({self.name})"


uint8 = DType("uint8", 1)
float16 = DType("float16", 2)
bfloat16 = DType("bfloat16", 2)


class MemoryFormat(enum.Enum):
    UNDEFINED = 0
    KV_2LTD = 1
    KV_T2D = 2
    BINARY = 3
    KV_MLA_FMT = 5


def nbytes_of(shape, dtype):
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


class MemoryObjMetadata:
    def __init__(self, shapes, dtypes, fmt):
        self.shapes = [tuple(s) for s in shapes]
        self.dtypes = list(dtypes)
        self.shape = self.shapes[0]
        self.fmt = fmt


class MemoryObj:
    def __init__(self, shapes, dtypes, fmt):
        self.meta = MemoryObjMetadata(shapes, dtypes, fmt)
        size = sum(nbytes_of(s, d) for s, d in zip(shapes, dtypes, strict=True))
        self.raw_data = memoryview(bytearray(size))
        self.refs = 1

    @property
    def byte_array(self):
        return self.raw_data

    def get_size(self):
        return self.raw_data.nbytes

    def get_shapes(self):
        return list(self.meta.shapes)

    def get_dtypes(self):
        return list(self.meta.dtypes)

    def get_memory_format(self):
        return self.meta.fmt

    def ref_count_down(self):
        self.refs -= 1
