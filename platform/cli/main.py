"""`loraplex ...`: argument parsing and dispatch (docs/api.md, "Command line").

Each subcommand names its handler as "module.function" in this package; the module is imported
only when the command runs, so `loraplex --help` does not load the engine, torch or the web
stack (the handlers' own imports are ordinary module-level ones).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

# The values of db.TenantTier and db.TenantStatus (tests/platform/test_cli_commands.py checks
# they agree): importing the registry package here would cost `--help` half a second.
TIERS = ("interactive", "standard", "batch")
STATUSES = ("active", "suspended")
# The values of db.AuditAction, db.AuditTarget and db.AuditResult (checked the same way).
AUDIT_ACTIONS = (
    "tenant.create",
    "tenant.update",
    "tenant.delete",
    "key.create",
    "key.revoke",
    "adapter.upload",
    "adapter.delete",
    "grant.create",
    "grant.delete",
)
AUDIT_TARGETS = ("tenant", "api_key", "adapter")
AUDIT_RESULTS = ("ok", "failed")

Handler = Callable[[argparse.Namespace], int]

DESCRIPTION = """Multi-tenant LoRA serving.

Settings come from LORAPLEX_* environment variables (docs/api.md, "Settings"). The database,
generated secrets and stored adapters live in the data directory: LORAPLEX_DATA_DIR, by default
$XDG_DATA_HOME/loraplex or ~/.local/share/loraplex, wherever the command runs."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loraplex",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="run the API server", description="Run the API server.")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="DIR", help="a Hugging Face checkpoint directory")
    source.add_argument(
        "--demo",
        action="store_true",
        help="embedded defaults: the demo model, tenant, key and adapters",
    )
    p.add_argument("--host", help="address to listen on (default: LORAPLEX_HOST, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default: LORAPLEX_PORT, 8000)")
    p.add_argument(
        "--quantization",
        choices=("fp8", "awq", "gptq"),
        help="quantized base: fp8 (online or an FP8 checkpoint), awq, gptq (default: "
        "LORAPLEX_QUANTIZATION, else the checkpoint's quantization_config)",
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        metavar="N",
        help="shard the model over N GPUs, one worker process each (default: "
        "LORAPLEX_TENSOR_PARALLEL_SIZE, 1)",
    )
    p.set_defaults(handler="serve.serve")

    p = sub.add_parser("db", help="database migrations", description="Database migrations.")
    db_sub = p.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    db_sub.add_parser(
        "upgrade", help="migrate to the code's schema (alembic upgrade head), create secrets"
    ).set_defaults(handler="commands.db_upgrade")

    p = sub.add_parser("admin", help="administration", description="Administration.")
    admin_sub = p.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")
    p = admin_sub.add_parser("token", help="print an admin JWT for /admin/v1")
    p.add_argument("--ttl", type=int, metavar="SECONDS", help="lifetime (default 3600)")
    p.add_argument("--subject", default="cli", help="who the token is for (audit)")
    p.set_defaults(handler="commands.admin_token")

    p = sub.add_parser("demo-model", help="write the demo checkpoint (SmolLM2) to PATH")
    p.add_argument("path", help="the directory to write")
    p.add_argument("--random", action="store_true", help="a tiny random-weight Llama instead")
    p.set_defaults(handler="commands.demo_model")

    p = sub.add_parser("demo-adapter", help="write a random LoRA adapter to PATH, to try it out")
    p.add_argument("path", help="the directory to write")
    p.add_argument("--model", metavar="DIR", help="its base model (default: the demo model)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--seed", type=int, default=0, help="the same seed writes the same adapter")
    p.set_defaults(handler="commands.demo_adapter")

    _tenant_parsers(sub)
    _key_parsers(sub)
    _adapter_parsers(sub)
    _audit_parsers(sub)
    return parser


def _limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--priority", choices=TIERS, help="scheduling tier")
    p.add_argument("--rpm", type=int, metavar="N", help="requests per minute")
    p.add_argument("--tpm", type=int, metavar="N", help="tokens per minute")
    p.add_argument("--concurrency", type=int, metavar="N", help="concurrent requests")


def _tenant_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tenants = sub.add_parser(
        "tenants", help="manage tenants", description="Manage tenants."
    ).add_subparsers(dest="tenants_command", required=True, metavar="COMMAND")
    p = tenants.add_parser("create", help="create a tenant (limits left out: the defaults)")
    p.add_argument("name", help="letters, digits and . _ -")
    _limit_args(p)
    p.set_defaults(handler="commands.tenants_create")
    tenants.add_parser("list", help="list tenants and their limits").set_defaults(
        handler="commands.tenants_list"
    )
    p = tenants.add_parser("update", help="change a tenant's name, tier, status or limits")
    p.add_argument("tenant", help="name or id")
    _limit_args(p)
    p.add_argument("--status", choices=STATUSES, help="suspended tenants are refused (403)")
    p.add_argument("--name", dest="new_name", metavar="NAME", help="rename")
    p.set_defaults(handler="commands.tenants_update")


def _key_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser(
        "keys", help="manage API keys", description="Manage API keys."
    ).add_subparsers(dest="keys_command", required=True, metavar="COMMAND")
    p = keys.add_parser("create", help="create an API key (the secret is printed once)")
    p.add_argument("tenant", help="name or id")
    p.add_argument("--name", default="", help="a label")
    p.add_argument("--expires-in-days", type=float, metavar="DAYS", help="default: never")
    p.set_defaults(handler="commands.keys_create")
    p = keys.add_parser("list", help="list a tenant's keys (prefixes only)")
    p.add_argument("tenant", help="name or id")
    p.set_defaults(handler="commands.keys_list")
    p = keys.add_parser("revoke", help="revoke a key (tokens made from it die with it)")
    p.add_argument("key_id", type=int, help="the key's id (from `keys list`)")
    p.set_defaults(handler="commands.keys_revoke")


def _adapter_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    adapters = sub.add_parser(
        "adapters", help="manage LoRA adapters", description="Manage LoRA adapters."
    ).add_subparsers(dest="adapters_command", required=True, metavar="COMMAND")
    p = adapters.add_parser("add", help="register a local PEFT adapter directory")
    p.add_argument("--tenant", required=True, help="name or id")
    p.add_argument("--name", required=True, help="the model name requests use")
    p.add_argument(
        "--model", metavar="DIR", help="the base model directory (default: LORAPLEX_MODEL)"
    )
    p.add_argument("dir", help="adapter_config.json + adapter_model.safetensors")
    p.set_defaults(handler="commands.adapters_add")
    p = adapters.add_parser("list", help="list adapters")
    p.add_argument("--tenant", help="name or id (default: every tenant)")
    p.set_defaults(handler="commands.adapters_list")
    p = adapters.add_parser("remove", help="unregister an adapter (its files go too)")
    p.add_argument("adapter_id", type=int, help="the adapter's id (from `adapters list`)")
    p.set_defaults(handler="commands.adapters_remove")


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


def _audit_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = sub.add_parser(
        "audit",
        help="the audit log of admin changes",
        description="The audit log: every admin change (API and CLI), refused ones included.",
    ).add_subparsers(dest="audit_command", required=True, metavar="COMMAND")
    p = audit.add_parser("list", help="list admin changes, newest first (tab-separated)")
    p.add_argument("--actor", help="exactly this actor (admin:<token subject>, cli:<OS user>)")
    p.add_argument(
        "--action",
        choices=AUDIT_ACTIONS,
        metavar="ACTION",
        help=f"only this action: {', '.join(AUDIT_ACTIONS)}",
    )
    p.add_argument("--target-type", choices=AUDIT_TARGETS, help="only targets of this kind")
    p.add_argument("--target-id", type=int, metavar="ID", help="only this target's id")
    p.add_argument("--result", choices=AUDIT_RESULTS, help="only changes that ended so")
    p.add_argument("--since", metavar="TIME", help="from this ISO 8601 time (UTC if no offset)")
    p.add_argument("--until", metavar="TIME", help="before this ISO 8601 time")
    p.add_argument(
        "--skip", type=_count(0), default=0, metavar="N", help="skip the N newest matches"
    )
    p.add_argument(
        "--limit", type=_count(1), default=50, metavar="N", help="at most N (default 50)"
    )
    p.set_defaults(handler="commands.audit_list")


def _handler(name: str) -> Handler:
    module, function = name.rsplit(".", 1)
    handler: Handler = getattr(importlib.import_module(f"loraplex.platform.cli.{module}"), function)
    return handler


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = _handler(args.handler)
    from pydantic import ValidationError  # after parsing: `--help` never pays for these

    from loraplex.platform.cli.commands import CommandError, validation_message
    from loraplex.platform.errors import LoraplexError
    from loraplex.platform.settings import MissingSecretError

    try:
        return handler(args)
    except (LoraplexError, CommandError, ValidationError, MissingSecretError) as e:
        if isinstance(e, ValidationError):
            message = validation_message(e)
        else:
            message = e.message if isinstance(e, LoraplexError) else str(e)
        print(f"loraplex: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
