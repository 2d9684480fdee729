"""Registry commands: they work on the database directly (no server needed). Every change is
recorded in the audit log as `cli:<OS user>`, refused ones included (`changing`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy.orm import Session

from loraplex.platform import crud
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.api.errors import describe
from loraplex.platform.audit import AuditEntry, AuditFailure, cli_actor, parse_time, recording
from loraplex.platform.auth import TokenCodec
from loraplex.platform.db import (
    AuditAction,
    AuditEvent,
    AuditResult,
    AuditTarget,
    Database,
    DatabaseNotMigratedError,
    Tenant,
    TenantTier,
    check_migrated,
)
from loraplex.platform.db import upgrade as db_upgrade_to_head
from loraplex.platform.demo.adapters import write_random_adapter
from loraplex.platform.demo.bootstrap import DEMO_B_STD
from loraplex.platform.demo.checkpoint import ensure_demo_checkpoint, write_smollm2_checkpoint
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from loraplex.platform.errors import LoraplexError
from loraplex.platform.schemas import ApiKeyCreate, TenantCreate, TenantUpdate
from loraplex.platform.settings import Settings
from loraplex.platform.storage import AdapterStore


class CommandError(Exception):
    """A command cannot run as asked; the message says why."""


@contextmanager
def _database(settings: Settings) -> Iterator[Database]:
    db = Database(settings.resolved_database_url)
    try:
        try:
            check_migrated(db.engine)
        except DatabaseNotMigratedError as e:
            raise CommandError(str(e)) from e
        yield db
    finally:
        db.dispose()


@contextmanager
def registry(settings: Settings) -> Iterator[Session]:
    with _database(settings) as db, db.session() as session:
        yield session


@contextmanager
def changing(settings: Settings, action: AuditAction) -> Iterator[tuple[Session, AuditEntry]]:
    """A registry session for one change, recorded in the audit log however it ends (the
    session is closed, so rolled back on failure, before the event is written)."""
    entry = AuditEntry(action=action, actor=cli_actor())
    with (
        _database(settings) as db,
        recording(db, entry, _explain),
        db.session() as session,
    ):
        yield session, entry


def _explain(exc: BaseException) -> AuditFailure:
    """A refused command with the error code the API gives the same error."""
    if isinstance(exc, LoraplexError):
        error = describe(exc)
        return AuditFailure(None, error.code or error.type, error.message)
    if isinstance(exc, ValidationError):
        return AuditFailure(None, "invalid_request_error", validation_message(exc))
    if isinstance(exc, CommandError):
        return AuditFailure(None, "command_error", str(exc))
    return AuditFailure(None, type(exc).__name__, "the command failed")


def validation_message(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())


def _tenant(session: Session, ref: str) -> Tenant:
    return (
        crud.read_tenant(session, int(ref))
        if ref.isdigit()
        else crud.read_tenant_by_name(session, ref)
    )


def db_upgrade(args: argparse.Namespace) -> int:
    """Migrate, and create the secrets the other commands need (the server's too)."""
    settings = Settings()
    db_upgrade_to_head(settings.resolved_database_url)
    if settings.jwt_algorithm == "HS256":
        settings.hs256_secret()
    settings.api_key_hash_secret()
    print(f"database at head: {settings.resolved_database_url}")
    print(f"data directory: {settings.data_dir}")
    return 0


def admin_token(args: argparse.Namespace) -> int:
    settings = Settings()
    if settings.jwt_algorithm == "HS256":
        settings.hs256_secret(create=False)  # a new one would sign tokens the server refuses
    try:
        token = TokenCodec(settings).issue_admin_token(
            args.subject, args.ttl or settings.admin_token_ttl_s
        )
    except ValueError as e:  # a TTL beyond LORAPLEX_MAX_TOKEN_TTL_S
        raise CommandError(str(e)) from e
    print(token)
    return 0


def demo_model(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if args.random:
        write_random_checkpoint(path)
    else:
        write_smollm2_checkpoint(path)
    print(f"wrote {path}")
    return 0


def demo_adapter(args: argparse.Namespace) -> int:
    """A random PEFT adapter (small enough that the model stays fluent) to try `adapters add`."""
    model = Path(args.model) if args.model else ensure_demo_checkpoint(Settings().cache_dir)
    path = write_random_adapter(
        model, Path(args.path), rank=args.rank, b_std=DEMO_B_STD, seed=args.seed
    )
    print(f"wrote {path} (rank {args.rank}, for {model})")
    return 0


def _print_tenant(t: Tenant) -> None:
    print(
        f"{t.id}\t{t.name}\t{t.priority}\t{t.status}\trpm={t.requests_per_minute}\t"
        f"tpm={t.tokens_per_minute}\tconcurrency={t.max_concurrent_requests}"
    )


def tenants_create(args: argparse.Namespace) -> int:
    settings = Settings()
    fields = {
        "name": args.name,
        "priority": args.priority,
        "requests_per_minute": args.rpm,
        "tokens_per_minute": args.tpm,
        "max_concurrent_requests": args.concurrency,
    }
    with changing(settings, AuditAction.TENANT_CREATE) as (session, audit):
        audit.note(**{k: v for k, v in fields.items() if v is not None})
        body = TenantCreate.model_validate(
            {**fields, "priority": args.priority or TenantTier.STANDARD}
        )
        tenant = crud.create_tenant(session, body, settings)
        audit.target_id = tenant.id
        _print_tenant(tenant)
    return 0


def tenants_list(args: argparse.Namespace) -> int:
    with registry(Settings()) as session:
        rows, _ = crud.read_tenants(session, 0, 1_000_000)
        for t in rows:
            _print_tenant(t)
    return 0


def tenants_update(args: argparse.Namespace) -> int:
    fields = {
        "name": args.new_name,
        "priority": args.priority,
        "status": args.status,
        "requests_per_minute": args.rpm,
        "tokens_per_minute": args.tpm,
        "max_concurrent_requests": args.concurrency,
    }
    changes = {k: v for k, v in fields.items() if v is not None}
    with changing(Settings(), AuditAction.TENANT_UPDATE) as (session, audit):
        audit.note(tenant=args.tenant, **changes)
        body = TenantUpdate.model_validate(changes)
        audit.target_id = _tenant(session, args.tenant).id
        _print_tenant(crud.update_tenant(session, audit.target_id, body))
    return 0


def keys_create(args: argparse.Namespace) -> int:
    settings = Settings()
    expires_at = None
    if args.expires_in_days is not None:
        expires_at = dt.datetime.now(dt.UTC) + dt.timedelta(days=args.expires_in_days)
    secret = settings.api_key_hash_secret(create=False)  # else the server would refuse the key
    with changing(settings, AuditAction.KEY_CREATE) as (session, audit):
        audit.note(
            tenant=args.tenant, name=args.name, expires_at=expires_at and expires_at.isoformat()
        )
        body = ApiKeyCreate(name=args.name, expires_at=expires_at)
        tenant = _tenant(session, args.tenant)
        row, key = crud.create_api_key(session, tenant.id, body, secret)
        audit.target_id = row.id  # the secret itself is never noted
        audit.note(tenant_id=tenant.id)
        print(f"key id {row.id} for tenant {tenant.name!r} (shown once, store it now):")
        print(key)
    return 0


def keys_list(args: argparse.Namespace) -> int:
    with registry(Settings()) as session:
        for k in crud.read_api_keys(session, _tenant(session, args.tenant).id):
            state = "revoked" if k.revoked_at else "active"
            print(
                f"{k.id}\t{k.prefix}...\t{k.name}\t{state}\texpires={k.expires_at}\t"
                f"last_used={k.last_used_at}"
            )
    return 0


def keys_revoke(args: argparse.Namespace) -> int:
    with changing(Settings(), AuditAction.KEY_REVOKE) as (session, audit):
        audit.target_id = args.key_id
        row = crud.revoke_api_key(session, args.key_id)
        audit.note(tenant_id=row.tenant_id, name=row.name)
        print(f"revoked key {row.id} ({row.prefix}...)")
    return 0


def adapters_add(args: argparse.Namespace) -> int:
    settings = Settings()
    model = args.model or settings.model
    source = Path(args.dir)
    with changing(settings, AuditAction.ADAPTER_UPLOAD) as (session, audit):
        audit.note(tenant=args.tenant, name=args.name, source=str(source.resolve()))
        if not model:
            raise CommandError(
                "the base model is needed to validate the adapter: pass --model or set "
                "LORAPLEX_MODEL"
            )
        if not source.is_dir():
            raise CommandError(f"{source} is not a directory")
        tenant = _tenant(session, args.tenant)
        row = crud.register_adapter(
            session,
            AdapterStore(settings.resolved_adapter_dir),
            engine_adapter_validator(model, settings.max_lora_rank),
            tenant_id=tenant.id,
            name=args.name,
            source_dir=source,
            base_model=Path(model).name,
        )
        audit.target_id = row.id
        audit.note(tenant_id=tenant.id, version=row.version, sha256=row.sha256, status=row.status)
        print(
            f"adapter {row.id} {row.name}@v{row.version} for tenant {tenant.name!r}: rank {row.rank}, "
            f"targets {','.join(row.target_modules)}, sha256 {row.sha256}"
        )
    return 0


def adapters_list(args: argparse.Namespace) -> int:
    with registry(Settings()) as session:
        tenant_id = _tenant(session, args.tenant).id if args.tenant else None
        for a in crud.read_adapters(session, tenant_id):
            print(
                f"{a.id}\t{a.tenant_id}\t{a.name}@v{a.version}\tr={a.rank}\t"
                f"{','.join(a.target_modules)}\t"
                f"{a.sha256[:12]}\t{a.status}"
            )
    return 0


def adapters_remove(args: argparse.Namespace) -> int:
    settings = Settings()
    with changing(settings, AuditAction.ADAPTER_DELETE) as (session, audit):
        audit.target_id = args.adapter_id
        row = crud.read_adapter(session, args.adapter_id)
        audit.note(tenant_id=row.tenant_id, name=row.name, version=row.version)
        crud.delete_adapter(session, AdapterStore(settings.resolved_adapter_dir), args.adapter_id)
        print(f"removed adapter {args.adapter_id}")
    return 0


def audit_list(args: argparse.Namespace) -> int:
    """Admin mutations, newest first, tab-separated; a note on stderr when more match."""
    try:
        since = parse_time(args.since) if args.since else None
        until = parse_time(args.until) if args.until else None
    except ValueError as e:
        raise CommandError(str(e)) from e
    where = crud.AuditFilter(
        actor=args.actor,
        action=AuditAction(args.action) if args.action else None,
        target_type=AuditTarget(args.target_type) if args.target_type else None,
        target_id=args.target_id,
        result=AuditResult(args.result) if args.result else None,
        since=since,
        until=until,
    )
    with registry(Settings()) as session:
        rows, count = crud.read_audit_events(session, where, args.skip, args.limit)
        for event in rows:
            print(_audit_line(event))
    if args.skip + len(rows) < count:
        print(
            f"({len(rows)} of {count} events from {args.skip}: --skip {args.skip + len(rows)} "
            "for the next ones)",
            file=sys.stderr,
        )
    return 0


def _audit_line(e: AuditEvent) -> str:
    outcome = " ".join(str(x) for x in (e.result, e.status_code, e.error_code) if x is not None)
    return (
        f"{e.id}\t{e.created_at.isoformat(timespec='seconds')}\t{e.actor}\t{e.action}\t"
        f"{e.target_type}:{e.target_id if e.target_id is not None else '-'}\t{outcome}\t"
        f"{e.request_id or '-'}\t{json.dumps(e.detail, sort_keys=True)}"
    )
