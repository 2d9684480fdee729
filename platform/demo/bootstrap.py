"""`loraplex serve --demo`: the embedded demo tenant, its API key and two demo adapters.

Idempotent: a second start finds everything in place. The demo key is kept in
`data_dir/demo_api_key` (mode 0600) so restarts print the same working key; real keys are
never stored anywhere but as a keyed hash.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from loraplex.platform import crud
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.auth import authenticate_api_key
from loraplex.platform.db import Database, TenantTier, upgrade
from loraplex.platform.demo.adapters import write_random_adapter
from loraplex.platform.errors import AuthenticationError, NotFoundError
from loraplex.platform.schemas import ApiKeyCreate, TenantCreate
from loraplex.platform.settings import Settings
from loraplex.platform.storage import AdapterStore

DEMO_TENANT = "demo"
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
    """Migrate the database and create (or find) the demo tenant, key and adapters."""
    assert settings.model, "the demo needs its model directory"
    upgrade(settings.resolved_database_url)
    db = Database(settings.resolved_database_url)
    key_file = settings.data_dir / "demo_api_key"
    secret = settings.api_key_hash_secret()
    try:
        with db.session() as session:
            try:
                tenant = crud.read_tenant_by_name(session, DEMO_TENANT)
            except NotFoundError:
                tenant = crud.create_tenant(
                    session,
                    TenantCreate(name=DEMO_TENANT, priority=TenantTier.INTERACTIVE),
                    settings,
                )
            api_key = _demo_key(session, key_file, tenant.id, secret)
            existing = {a.name for a in crud.read_adapters(session, tenant.id)}
            validate = engine_adapter_validator(settings.model, settings.max_lora_rank)
            store = AdapterStore(settings.resolved_adapter_dir)
            for name, rank, targets, seed in DEMO_ADAPTERS:
                if name in existing:
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    source = write_random_adapter(
                        settings.model,
                        Path(tmp) / name,
                        rank=rank,
                        target_modules=targets,
                        b_std=DEMO_B_STD,
                        seed=seed,
                    )
                    crud.register_adapter(
                        session,
                        store,
                        validate,
                        tenant_id=tenant.id,
                        name=name,
                        source_dir=source,
                        base_model=Path(settings.model).name,
                    )
            return DemoSetup(
                api_key=api_key,
                tenant_id=tenant.id,
                adapter_names=tuple(name for name, *_ in DEMO_ADAPTERS),
            )
    finally:
        db.dispose()


def _demo_key(session: Session, key_file: Path, tenant_id: int, secret: bytes) -> str:
    if key_file.exists():
        key = key_file.read_text().strip()
        try:
            if authenticate_api_key(session, key, secret).tenant_id == tenant_id:
                return key
        except AuthenticationError:
            pass  # the database was reset: make a new one
    _, key = crud.create_api_key(session, tenant_id, ApiKeyCreate(name="demo"), secret)
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
