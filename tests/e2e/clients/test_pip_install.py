"""
`pip install ./clients/python` into a fresh virtual environment, offline: Debian's python3-venv
and python3-setuptools (via --system-site-packages and --no-build-isolation), no index. Then
the package imports from the venv — not from the source tree — with every module.
"""

import shutil
import subprocess
import sys

from .conftest import CLIENT_SRC


def test_pip_install_into_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    leftovers = [CLIENT_SRC / "build", CLIENT_SRC / "kvrelay.egg-info"]
    existed = {p: p.exists() for p in leftovers}
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, capture_output=True, timeout=120)
    try:
        p = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-build-isolation", "--no-index",
                            "--no-cache-dir", "--disable-pip-version-check", str(CLIENT_SRC)],
                           capture_output=True, timeout=180, cwd=str(tmp_path))
        assert p.returncode == 0, p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
    finally:
        for path, was in existed.items():  # the build leaves these in the tree: not ours to keep
            if not was and path.exists():
                shutil.rmtree(path)
    code = ("import kvrelay, kvrelay.lmcache, kvrelay.sglang, kvrelay.cluster, kvrelay.events, kvrelay_client, sys;"
            "assert 'site-packages' in kvrelay.__file__, kvrelay.__file__;"
            "print(kvrelay.__version__, kvrelay.Client.__name__, kvrelay.lmcache.KvrelayL2Adapter.__name__,"
            " kvrelay.sglang.KvrelayHiCacheStorage.__name__, kvrelay.events.Subscriber.__name__)")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, timeout=60,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout.decode().split() == ["0.2.0", "Client", "KvrelayL2Adapter", "KvrelayHiCacheStorage", "Subscriber"]
    assert sys.prefix != str(venv)
