"""Stand-in of LMCache's lmcache/v1/memory_management.py as the older remote connectors meet it
(LMCache/LMCache, base_connector.py @01712fbd's era): MemoryFormat, and a MemoryObj of ONE
shape and dtype (get_shape, get_dtype, get_memory_format, byte_array, meta.shape, raw_data,
ref_count_down). Member values are this stand-in's; DType replaces torch's dtypes."""

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


class MemoryObjMetadata:
    def __init__(self, shape, dtype, fmt):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.fmt = fmt


def nbytes_of(shape, dtype):
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


class MemoryObj:
    def __init__(self, shape, dtype, fmt):
        self.meta = MemoryObjMetadata(shape, dtype, fmt)
        self.raw_data = memoryview(bytearray(nbytes_of(shape, dtype)))
        self.refs = 1

    @property
    def byte_array(self):
        return self.raw_data

    def get_size(self):
        return self.raw_data.nbytes

    def get_shape(self):
        return self.meta.shape

    def get_dtype(self):
        return self.meta.dtype

    def get_memory_format(self):
        return self.meta.fmt

    def ref_count_down(self):
        self.refs -= 1
