"""
Loads an engine's interface stand-in (tests/e2e/clients/upstream/, README there) under the
engine's own module names, then imports the kvrelay adapter module afresh, as it is imported
inside that engine: the adapter detects what it finds at import.
"""

import contextlib
import importlib
import importlib.util
import sys
from pathlib import Path

UPSTREAM = Path(__file__).resolve().parent / "upstream"
# stand-in directory -> (top-level package it provides, the kvrelay module that adapts to it)
STANDINS = {
    "lmcache_older": ("lmcache", "kvrelay.lmcache"),
    "lmcache_newer": ("lmcache", "kvrelay.lmcache"),
    "sglang": ("sglang", "kvrelay.sglang"),
}


def _purge(package):
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


@contextlib.contextmanager
def engine(standin):
    """with engine("lmcache_newer") as (adapter_module, engine_import): ...

    The adapter module is executed afresh as a NEW module object (its import-time detection
    sees the stand-in); objects made from it keep working after the context, so adapters of two
    generations can run side by side. On leaving, the stand-in's modules are unloaded and the
    previous adapter module object is put back."""
    package, adapter = STANDINS[standin]
    root = str(UPSTREAM / standin)
    saved = {m: sys.modules[m] for m in list(sys.modules) if m == package or m.startswith(package + ".")}
    parent_name, _, child = adapter.rpartition(".")
    parent = importlib.import_module(parent_name)
    old_adapter = sys.modules.get(adapter)
    _purge(package)
    sys.path.insert(0, root)
    try:
        importlib.invalidate_caches()
        spec = importlib.util.find_spec(adapter)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[adapter] = mod
        spec.loader.exec_module(mod)
        yield mod, importlib.import_module
    finally:
        sys.path.remove(root)
        _purge(package)
        sys.modules.update(saved)
        if old_adapter is not None:
            sys.modules[adapter] = old_adapter
            setattr(parent, child, old_adapter)
        else:
            sys.modules.pop(adapter, None)
