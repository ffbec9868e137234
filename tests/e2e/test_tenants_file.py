"""
The tenants file (--tenants, docs/operations.md "Tenants file") against the real binary:

  - a malformed file refuses the start, exit non-zero, naming the line;
  - its tokens (and --token's) are accepted, others refused with 401;
  - SIGHUP with a malformed file logs the refusal, naming the line, and the table in force stays
    (its tokens keep working); a good file then replaces it (a removed token is refused);
  - a change is seen without a signal, also through the symlink swap of a Kubernetes Secret.

The namespaces' own effect on the store is tested by the store's tests, not here.
"""

import hashlib
import os
import signal

from conftest import SLOW, run_binary, wait_until

BASE = ("--memory", "16M", "--workers", "1")


def write(path, text):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def status(srv, token):
    return srv.request("GET", "/kv/no-such-block", token=token).status


def log_count(srv, text):
    return srv.log_text().count(text)


def test_a_malformed_file_refuses_the_start_naming_the_line(tmp_path):
    f = tmp_path / "tenants"
    f.write_text("# tenants\nteam-a tok-a\nteam/b tok-b\n")
    p = run_binary(["--http-bind", "127.0.0.1:0", "--grpc-bind", "off", *BASE, "--tenants", str(f)])
    out = (p.stdout + p.stderr).decode(errors="replace")
    assert p.returncode != 0, out
    assert 'tenants: line 3: namespace "team/b" has a character outside [A-Za-z0-9._-]' in out, out
    assert "tok-b" not in out, "a refusal never shows a token"


def test_tokens_open_and_a_bad_reload_keeps_the_table(tmp_path, kvrelay):
    f = tmp_path / "tenants"
    digest = hashlib.sha256(b"tok-b").hexdigest()
    write(f, f"team-a tok-a memory=64M\nteam-b sha256:{digest}\n")
    srv = kvrelay(*BASE, "--tenants", str(f), "--token", "legacy", "--admin-token", "root")
    assert "tenants: 3 tokens, 3 namespaces (generation 1)" in srv.log_text()
    assert status(srv, None) == 401
    assert status(srv, "nope") == 401
    for tok in ("tok-a", "tok-b", "legacy", "root"):
        assert status(srv, tok) == 404, tok

    write(f, "team-a tok-a\n\nlonely   # no token\n")
    os.kill(srv.pid, signal.SIGHUP)
    refusal = 'tenants: reload refused: line 3: namespace "lonely" has no token'
    wait_until(lambda: log_count(srv, refusal) >= 1, 5 * SLOW, what="the refusal in the log")
    assert "the previous table stays in force" in srv.log_text()
    for tok in ("tok-a", "tok-b", "legacy"):
        assert status(srv, tok) == 404, f"{tok}: the previous table stays"

    write(f, "team-c tok-c\nteam-b tok-b\n")
    os.kill(srv.pid, signal.SIGHUP)
    wait_until(lambda: status(srv, "tok-a") == 401, 5 * SLOW, what="tok-a revoked")
    assert "tenants: reloaded: 3 tokens, 3 namespaces" in srv.log_text()
    assert status(srv, "tok-c") == 404
    assert status(srv, "tok-b") == 404
    assert status(srv, "legacy") == 404, "--token stays in namespace default"
    assert srv.alive()


def test_token_and_admin_token_without_a_tenants_file(kvrelay):
    srv = kvrelay(*BASE, "--token", "legacy", "--admin-token", "root")
    assert "tenants: 1 tokens, 1 namespaces (generation 1), admin token set" in srv.log_text()
    assert status(srv, None) == 401
    assert status(srv, "legacy") == 404
    assert status(srv, "root") == 404, "the admin token works in namespace default"
    os.kill(srv.pid, signal.SIGHUP)
    wait_until(lambda: "SIGHUP: nothing to reload" in srv.log_text(), 5 * SLOW, what="the SIGHUP line")
    assert status(srv, "legacy") == 404


def test_a_secret_update_is_seen_without_a_signal(tmp_path, kvrelay):
    """A Kubernetes Secret volume: the file is a symlink through ..data, which the update swaps."""
    vol = tmp_path / "secret"
    vol.mkdir()
    (vol / "v1").mkdir()
    write(vol / "v1" / "tenants", "team-a tok-a\n")
    os.symlink("v1", vol / "..data")
    os.symlink("..data/tenants", vol / "tenants")
    srv = kvrelay(*BASE, "--tenants", str(vol / "tenants"))
    assert status(srv, "tok-a") == 404
    assert status(srv, "tok-z") == 401

    (vol / "v2").mkdir()
    write(vol / "v2" / "tenants", "team-z tok-z\n")
    os.symlink("v2", vol / "..data.tmp")
    os.replace(vol / "..data.tmp", vol / "..data")
    wait_until(lambda: status(srv, "tok-z") == 404, 5 * SLOW, what="tok-z accepted after the swap")
    assert status(srv, "tok-a") == 401
    assert "tenants: the file changed" in srv.log_text()
