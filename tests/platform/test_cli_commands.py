"""The `loraplex` registry commands, run in-process against a SQLite file."""

from __future__ import annotations

import argparse
import getpass
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jwt
import pytest
from sqlalchemy import select

from loraplex.platform import crud
from loraplex.platform.cli import main
from loraplex.platform.cli.main import (
    AUDIT_ACTIONS,
    AUDIT_RESULTS,
    AUDIT_TARGETS,
    STATUSES,
    TIERS,
    _parser,
)
from loraplex.platform.db import (
    ApiKey,
    AuditAction,
    AuditEvent,
    AuditResult,
    AuditTarget,
    Database,
    TenantStatus,
    TenantTier,
    upgrade,
)
from loraplex.platform.demo.bootstrap import bootstrap_demo
from loraplex.platform.settings import Settings


@pytest.fixture
def env(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in list(os.environ):
        if key.startswith("LORAPLEX_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("LORAPLEX_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LORAPLEX_MODEL", str(tiny_model_dir))
    return tmp_path / "data"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_registry_commands(
    env: Path, capsys: pytest.CaptureFixture[str], adapter_sources: dict[str, Path], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "tenants", "list")
    assert code == 1 and "run `loraplex db upgrade`" in err
    code, _, err = run(capsys, "serve")
    assert code == 1 and "run `loraplex db upgrade`" in err

    assert run(capsys, "db", "upgrade")[0] == 0
    assert run(capsys, "db", "upgrade")[0] == 0  # idempotent
    code, out, _ = run(capsys, "tenants", "create", "acme", "--priority", "batch", "--rpm", "5")
    assert code == 0 and "acme\tbatch\tactive\trpm=5" in out
    assert run(capsys, "tenants", "create", "acme")[0] == 1  # taken
    assert run(capsys, "tenants", "create", "bad name")[0] == 1
    code, out, _ = run(capsys, "tenants", "update", "acme", "--status", "suspended", "--tpm", "99")
    assert code == 0 and "suspended\trpm=5\ttpm=99" in out
    assert "acme" in run(capsys, "tenants", "list")[1]

    code, out, _ = run(capsys, "keys", "create", "acme", "--name", "ci")
    key = out.strip().splitlines()[-1]
    assert code == 0 and key.startswith("lpx-")
    with Database(Settings().resolved_database_url).session() as session:
        row = session.scalars(select(ApiKey)).one()
        assert row.name == "ci" and key.startswith(row.prefix) and key not in row.key_hash
        key_id = row.id
    assert f"{key_id}\t{key[:12]}...\tci\tactive" in run(capsys, "keys", "list", "acme")[1]
    assert run(capsys, "keys", "revoke", str(key_id))[0] == 0
    assert "revoked" in run(capsys, "keys", "list", "1")[1]
    assert run(capsys, "keys", "revoke", "999")[0] == 1

    written = tmp_path / "mine"
    code, out, _ = run(
        capsys, "demo-adapter", str(written), "--model", os.environ["LORAPLEX_MODEL"]
    )
    assert code == 0 and (written / "adapter_model.safetensors").is_file()
    code, out, _ = run(
        capsys, "adapters", "add", "--tenant", "acme", "--name", "mine", str(written)
    )
    assert code == 0 and "rank 8" in out
    code, out, _ = run(
        capsys, "adapters", "add", "--tenant", "acme", "--name", "bot", str(adapter_sources["r8"])
    )
    assert code == 0 and "rank 8" in out
    assert "bot@v1\tr=8" in run(capsys, "adapters", "list", "--tenant", "acme")[1]
    code, out, _ = run(
        capsys, "adapters", "add", "--tenant", "acme", "--name", "bot", str(adapter_sources["r4"])
    )
    assert code == 0 and "bot@v2" in out  # the name taken: a new version
    assert "bot@v2\tr=4" in run(capsys, "adapters", "list", "--tenant", "acme")[1]
    # A pickle next to the weights: refused, nothing stored.
    bad = tmp_path / "bad"
    shutil.copytree(adapter_sources["r4"], bad)
    (bad / "adapter_model.safetensors").unlink()
    (bad / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    code, _, err = run(capsys, "adapters", "add", "--tenant", "acme", "--name", "evil", str(bad))
    assert code == 1 and "adapter_model.safetensors" in err
    for adapter_id in ("1", "2", "3"):  # mine, bot@v1, bot@v2
        assert run(capsys, "adapters", "remove", adapter_id)[0] == 0
    assert run(capsys, "adapters", "list")[1] == ""
    assert not list((env / "adapters").glob("*/*"))  # the stored files went with it
    assert not list((env / "adapters").glob(".staging-*"))  # nothing half-copied left

    code, out, _ = run(capsys, "admin", "token", "--ttl", "60")
    claims = jwt.decode(
        out.strip(), Settings().hs256_secret(), algorithms=["HS256"], audience="loraplex"
    )
    assert claims["scope"] == "admin" and claims["exp"] - claims["iat"] == 60
    code, _, err = run(capsys, "admin", "token", "--ttl", str(10**9))
    assert code == 1 and "ttl must be in" in err


def test_changes_are_audited_as_the_os_user(
    env: Path, capsys: pytest.CaptureFixture[str], adapter_sources: dict[str, Path]
) -> None:
    """Each registry change leaves an audit event as `cli:<user>`, refused ones included;
    `audit list` shows them newest first, filtered and paged."""
    actor = f"cli:{getpass.getuser()}"
    assert run(capsys, "db", "upgrade")[0] == 0
    assert run(capsys, "tenants", "create", "acme", "--rpm", "5")[0] == 0
    assert run(capsys, "tenants", "create", "acme")[0] == 1  # taken
    assert run(capsys, "tenants", "create", "bad name")[0] == 1  # refused before the registry
    assert run(capsys, "tenants", "update", "nobody", "--tpm", "9")[0] == 1
    assert run(capsys, "tenants", "update", "acme", "--status", "suspended")[0] == 0
    key = run(capsys, "keys", "create", "acme", "--name", "ci")[1].strip().splitlines()[-1]
    assert run(capsys, "keys", "revoke", "1")[0] == 0
    assert run(capsys, "keys", "revoke", "7")[0] == 1
    assert (
        run(capsys, "adapters", "add", "--tenant", "acme", "--name", "bot", "/nonexistent")[0] == 1
    )
    code, _, _ = run(
        capsys, "adapters", "add", "--tenant", "acme", "--name", "bot", str(adapter_sources["r4"])
    )
    assert code == 0 and run(capsys, "adapters", "remove", "1")[0] == 0

    with Database(Settings().resolved_database_url).session() as session:
        events = session.scalars(select(AuditEvent).order_by(AuditEvent.id)).all()
    assert {e.actor for e in events} == {actor}
    assert all(e.status_code is None and e.request_id is None for e in events)
    assert [(e.action, e.target_id, e.result, e.error_code) for e in events] == [
        ("tenant.create", 1, "ok", None),
        ("tenant.create", None, "failed", "conflict"),
        ("tenant.create", None, "failed", "invalid_request_error"),
        ("tenant.update", None, "failed", "not_found"),
        ("tenant.update", 1, "ok", None),
        ("key.create", 1, "ok", None),
        ("key.revoke", 1, "ok", None),
        ("key.revoke", 7, "failed", "not_found"),
        ("adapter.upload", None, "failed", "command_error"),
        ("adapter.upload", 1, "ok", None),
        ("adapter.delete", 1, "ok", None),
    ]
    assert events[0].detail == {"name": "acme", "requests_per_minute": 5}
    assert events[3].detail["tenant"] == "nobody" and "not found" in events[3].detail["error"]
    assert events[5].detail == {"tenant": "acme", "name": "ci", "expires_at": None, "tenant_id": 1}
    assert key not in str([e.detail for e in events]) and key[4:] not in str(events[5].detail)
    assert events[9].detail["version"] == 1 and events[9].detail["status"] == "ready"

    code, out, err = run(capsys, "audit", "list")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 11 and err == ""
    assert lines[0].split("\t")[2:6] == [actor, "adapter.delete", "adapter:1", "ok"]
    code, out, err = run(capsys, "audit", "list", "--result", "failed", "--limit", "2")
    assert [line.split("\t")[3:6] for line in out.splitlines()] == [
        ["adapter.upload", "adapter:-", "failed command_error"],
        ["key.revoke", "api_key:7", "failed not_found"],
    ]
    assert "2 of 5 events" in err and "--skip 2" in err
    out = run(capsys, "audit", "list", "--target-type", "tenant", "--target-id", "1")[1]
    assert len(out.splitlines()) == 2
    assert run(capsys, "audit", "list", "--action", "key.create", "--actor", "cli:x")[1] == ""
    assert len(run(capsys, "audit", "list", "--since", "2000-01-01")[1].splitlines()) == 11
    assert run(capsys, "audit", "list", "--until", "2000-01-01T00:00:00+01:00")[1] == ""
    code, _, err = run(capsys, "audit", "list", "--since", "0")
    assert code == 1 and "ISO 8601" in err


def test_demo_bootstrap_is_idempotent(env: Path) -> None:
    settings = Settings()
    first = bootstrap_demo(settings)
    second = bootstrap_demo(Settings())
    assert first == second and first.api_key.startswith("lpx-")
    assert len(first.adapter_names) == 2
    with Database(settings.resolved_database_url).session() as session:
        assert len(session.scalars(select(ApiKey)).all()) == 1
        events = session.scalars(select(AuditEvent).order_by(AuditEvent.id)).all()
    # What the demo created is audited once, as `demo`; the second start created nothing.
    assert [(e.actor, e.action, e.target_id, e.result) for e in events] == [
        ("demo", "tenant.create", 1, "ok"),
        ("demo", "key.create", 1, "ok"),
        ("demo", "adapter.upload", 1, "ok"),
        ("demo", "adapter.upload", 2, "ok"),
    ]
    assert events[2].detail["name"] == first.adapter_names[0]
    assert first.api_key not in str([e.detail for e in events])

    # A reset key file (the database kept) makes a new key, audited too.
    (env / "demo_api_key").unlink()
    third = bootstrap_demo(Settings())
    assert third.api_key != first.api_key and third.tenant_id == first.tenant_id
    with Database(settings.resolved_database_url).session() as session:
        last = session.scalars(select(AuditEvent).order_by(AuditEvent.id.desc())).first()
    assert last is not None and (last.action, last.target_id) == ("key.create", 2)


def test_commands_that_use_secrets_never_mint_them(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`admin token` or `keys create` run against a data directory without the server's
    secrets would make credentials the server refuses: they stop and say why instead."""
    upgrade(Settings().resolved_database_url)  # migrated, but no secret made yet
    assert run(capsys, "tenants", "create", "acme")[0] == 0
    for argv in (("admin", "token"), ("keys", "create", "acme")):
        code, out, err = run(capsys, *argv)
        assert code == 1 and out == "", argv
        assert "LORAPLEX_DATA_DIR" in err and "loraplex db upgrade" in err, err
    assert not (env / "jwt_secret").exists() and not (env / "api_key_secret").exists()
    code, out, _ = run(capsys, "db", "upgrade")  # makes them, once
    assert code == 0 and str(env) in out
    assert run(capsys, "admin", "token")[0] == 0 and run(capsys, "keys", "create", "acme")[0] == 0


def test_help_is_fast_and_complete() -> None:
    """Every command and option says what it does, and `--help` loads neither the engine nor
    the web stack (it took seconds when it did)."""
    parser = _parser()
    undocumented = []
    stack = [("loraplex", parser)]
    while stack:
        name, p = stack.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in action._choices_actions}
                for sub_name, sub in action.choices.items():
                    if not helps.get(sub_name):
                        undocumented.append(f"{name} {sub_name}")
                    stack.append((f"{name} {sub_name}", sub))
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                undocumented.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not undocumented, undocumented
    code = (
        "import sys\n"
        "from loraplex.platform.cli import main\n"
        "try:\n    main(['tenants', 'create', '--help'])\n"
        "except SystemExit:\n    pass\n"
        "heavy = {'torch', 'fastapi', 'sqlalchemy', 'loraplex.engine'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "--concurrency" in result.stdout and "concurrent requests" in result.stdout


def test_cli_choices_are_the_registry_values() -> None:
    assert tuple(t.value for t in TenantTier) == TIERS
    assert tuple(s.value for s in TenantStatus) == STATUSES
    assert tuple(a.value for a in AuditAction) == AUDIT_ACTIONS
    assert tuple(t.value for t in AuditTarget) == AUDIT_TARGETS
    assert tuple(r.value for r in AuditResult) == AUDIT_RESULTS


def test_a_failed_demo_step_is_audited_with_its_error(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(crud, "register_adapter", full_disk)
    with pytest.raises(OSError, match="No space"):
        bootstrap_demo(Settings())
    with Database(Settings().resolved_database_url).session() as session:
        events = session.scalars(select(AuditEvent).order_by(AuditEvent.id)).all()
    assert [(e.action, e.result, e.error_code) for e in events] == [
        ("tenant.create", "ok", None),
        ("key.create", "ok", None),
        ("adapter.upload", "failed", "OSError"),
    ]
    assert events[2].detail["error"] == "No space left on device"
