"""Stand-in of LMCache's lmcache/v1/metadata.py LMCacheMetadata (dev branch, 2026), what
RemoteConnector.__init__ reads: get_shapes() / get_dtypes() (a full chunk's layout per KV
group), get_num_groups(), chunk_size, use_mla."""


class LMCacheMetadata:
    def __init__(self, shapes, dtypes, chunk_size, use_mla=False):
        self._shapes = [tuple(s) for s in shapes]
        self._dtypes = list(dtypes)
        self.chunk_size = chunk_size
        self.use_mla = use_mla

    def get_shapes(self):
        return list(self._shapes)

    def get_dtypes(self):
        return list(self._dtypes)

    def get_num_groups(self):
        return len(self._shapes)
