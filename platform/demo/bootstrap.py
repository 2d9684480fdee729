"""`loraplex serve --demo`: the embedded demo tenant, its API key and two demo adapters.

Idempotent: a second start finds everything in place. The demo key is kept in
`data_dir/demo_api_key` (mode 0600) so restarts print the same working key; real keys are
never stored anywhere but as a keyed hash.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from loraplex.platform import crud
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.audit import AuditEntry, AuditFailure, recording
from loraplex.platform.auth import authenticate_api_key
from loraplex.platform.db import AuditAction, Database, TenantTier, upgrade
from loraplex.platform.demo.adapters import write_random_adapter
from loraplex.platform.errors import AuthenticationError, NotFoundError
from loraplex.platform.schemas import ApiKeyCreate, TenantCreate
from loraplex.platform.settings import Settings
from loraplex.platform.storage import AdapterStore

DEMO_TENANT = "demo"
DEMO_ACTOR = "demo"  # the audit log's actor for what `serve --demo` creates
# Small enough that the demo model stays fluent, large enough that outputs change.
DEMO_B_STD = 0.01
# name, rank, target modules, seed
DEMO_ADAPTERS = (
    ("demo-support", 8, ("q_proj", "v_proj"), 1),
    ("demo-poet", 16, ("q_proj", "k_proj", "v_proj", "o_proj"), 2),
)


@dataclass(frozen=True)
class DemoSetup:
    api_key: str
    tenant_id: int
    adapter_names: tuple[str, ...]


def bootstrap_demo(settings: Settings) -> DemoSetup:
    """Migrate the database and create (or find) the demo tenant, key and adapters. What it
    creates is in the audit log as the actor `demo`, as the command line's changes are."""
    assert settings.model, "the demo needs its model directory"
    upgrade(settings.resolved_database_url)
    db = Database(settings.resolved_database_url)
    try:
        tenant_id = _demo_tenant(db, settings)
        secret = settings.api_key_hash_secret()
        api_key = _demo_key(db, settings.data_dir / "demo_api_key", tenant_id, secret)
        with db.session() as session:
            existing = {a.name for a in crud.read_adapters(session, tenant_id)}
        validate = engine_adapter_validator(settings.model, settings.max_lora_rank)
        store = AdapterStore(settings.resolved_adapter_dir)
        for name, rank, targets, seed in DEMO_ADAPTERS:
            if name in existing:
                continue
            with (
                _change(db, AuditAction.ADAPTER_UPLOAD) as (session, audit),
                tempfile.TemporaryDirectory() as tmp,
            ):
                audit.note(tenant=DEMO_TENANT, name=name)
                source = write_random_adapter(
                    settings.model,
                    Path(tmp) / name,
                    rank=rank,
                    target_modules=targets,
                    b_std=DEMO_B_STD,
                    seed=seed,
                )
                row = crud.register_adapter(
                    session,
                    store,
                    validate,
                    tenant_id=tenant_id,
                    name=name,
                    source_dir=source,
                    base_model=Path(settings.model).name,
                )
                audit.target_id = row.id
                audit.note(tenant_id=tenant_id, version=row.version, sha256=row.sha256)
        return DemoSetup(
            api_key=api_key,
            tenant_id=tenant_id,
            adapter_names=tuple(name for name, *_ in DEMO_ADAPTERS),
        )
    finally:
        db.dispose()


@contextmanager
def _change(db: Database, action: AuditAction) -> Iterator[tuple[Session, AuditEntry]]:
    """A session for one change, recorded in the audit log however it ends."""
    entry = AuditEntry(action=action, actor=DEMO_ACTOR)
    with recording(db, entry, _explain), db.session() as session:
        yield session, entry


def _explain(exc: BaseException) -> AuditFailure:
    """The failure in the audit log as the operator's traceback names it (the set-up stops)."""
    return AuditFailure(None, type(exc).__name__, str(exc) or "the demo set-up failed")


def _demo_tenant(db: Database, settings: Settings) -> int:
    with db.session() as session:
        try:
            return crud.read_tenant_by_name(session, DEMO_TENANT).id
        except NotFoundError:
            pass
    with _change(db, AuditAction.TENANT_CREATE) as (session, audit):
        audit.note(name=DEMO_TENANT, priority=TenantTier.INTERACTIVE.value)
        body = TenantCreate(name=DEMO_TENANT, priority=TenantTier.INTERACTIVE)
        tenant = crud.create_tenant(session, body, settings)
        audit.target_id = tenant.id
        return tenant.id


def _demo_key(db: Database, key_file: Path, tenant_id: int, secret: bytes) -> str:
    if key_file.exists():
        key = key_file.read_text().strip()
        with db.session() as session:
            try:
                if authenticate_api_key(session, key, secret).tenant_id == tenant_id:
                    return key
            except AuthenticationError:
                pass  # the database was reset: make a new one
    with _change(db, AuditAction.KEY_CREATE) as (session, audit):
        audit.note(tenant=DEMO_TENANT, name="demo", tenant_id=tenant_id)
        row, key = crud.create_api_key(session, tenant_id, ApiKeyCreate(name="demo"), secret)
        audit.target_id = row.id  # the secret itself is never noted
    key_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return key


def demo_banner(setup: DemoSetup, base_url: str, model_dir: Path, data_dir: Path, cli: str) -> str:
    """What `serve --demo` prints: where it listens, the key, the models, the paths the other
    commands need, and examples to paste (greedy, so they answer the same every time)."""
    return f"""
Loraplex demo is starting on {base_url}

  API key (tenant {DEMO_TENANT!r}): {setup.api_key}
    export KEY={setup.api_key}
  models: {model_dir.name} (base), {", ".join(setup.adapter_names)} (LoRA adapters)
  model directory (for `adapters add --model`): {model_dir}
  data directory (database, secrets, adapters): {data_dir}

  curl {base_url}/v1/chat/completions -H "Authorization: Bearer $KEY" \\
    -H 'Content-Type: application/json' -d '{{"model": "{model_dir.name}", "temperature": 0,
    "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}'

  admin token: {cli} admin token
  admin console: {base_url}/admin/    (sign in with that token)
"""
