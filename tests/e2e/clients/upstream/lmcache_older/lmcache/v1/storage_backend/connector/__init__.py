"""Stand-in of LMCache's lmcache/v1/storage_backend/connector/__init__.py @0109660c
(LMCache/LMCache): ConnectorAdapter (schema, can_parse, create_connector) and ConnectorContext,
what ConnectorManager hands to create_connector."""

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass
class ConnectorContext:
    url: str
    loop: Any
    local_cpu_backend: Any
    config: Optional[Any]
    metadata: Optional[Any]


class ConnectorAdapter:
    def __init__(self, schema: str):
        self.schema = schema

    def can_parse(self, url: str) -> bool:
        return url.startswith(self.schema)

    def create_connector(self, context: ConnectorContext):
        raise NotImplementedError
