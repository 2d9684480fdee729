"""`loraplex ...`: argument parsing and dispatch (docs/api.md, "Command line")."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from loraplex.platform.cli import commands, serve
from loraplex.platform.db import TenantStatus, TenantTier
from loraplex.platform.errors import LoraplexError

Handler = Callable[[argparse.Namespace], int]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loraplex", description="Multi-tenant LoRA serving.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the API server")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", help="a Hugging Face checkpoint directory")
    source.add_argument(
        "--demo",
        action="store_true",
        help="embedded defaults: the demo model, tenant, key and adapters",
    )
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.set_defaults(handler=serve.serve)

    p = sub.add_parser("db", help="database migrations")
    db_sub = p.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", help="alembic upgrade head").set_defaults(
        handler=commands.db_upgrade
    )

    p = sub.add_parser("admin", help="administration")
    admin_sub = p.add_subparsers(dest="admin_command", required=True)
    p = admin_sub.add_parser("token", help="print an admin JWT")
    p.add_argument("--ttl", type=int, help="lifetime in seconds")
    p.add_argument("--subject", default="cli", help="who the token is for (audit)")
    p.set_defaults(handler=commands.admin_token)

    p = sub.add_parser("demo-model", help="write the demo checkpoint (SmolLM2) to PATH")
    p.add_argument("path")
    p.add_argument("--random", action="store_true", help="a tiny random-weight Llama instead")
    p.set_defaults(handler=commands.demo_model)

    _tenant_parsers(sub)
    _key_parsers(sub)
    _adapter_parsers(sub)
    return parser


def _limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--priority", choices=[tier.value for tier in TenantTier])
    p.add_argument("--rpm", type=int, help="requests per minute")
    p.add_argument("--tpm", type=int, help="tokens per minute")
    p.add_argument("--concurrency", type=int, help="concurrent requests")


def _tenant_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tenants = sub.add_parser("tenants", help="manage tenants").add_subparsers(
        dest="tenants_command", required=True
    )
    p = tenants.add_parser("create")
    p.add_argument("name")
    _limit_args(p)
    p.set_defaults(handler=commands.tenants_create)
    tenants.add_parser("list").set_defaults(handler=commands.tenants_list)
    p = tenants.add_parser("update")
    p.add_argument("tenant", help="name or id")
    _limit_args(p)
    p.add_argument("--status", choices=[status.value for status in TenantStatus])
    p.add_argument("--name", dest="new_name")
    p.set_defaults(handler=commands.tenants_update)


def _key_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(
        dest="keys_command", required=True
    )
    p = keys.add_parser("create")
    p.add_argument("tenant", help="name or id")
    p.add_argument("--name", default="")
    p.add_argument("--expires-in-days", type=float)
    p.set_defaults(handler=commands.keys_create)
    p = keys.add_parser("list")
    p.add_argument("tenant", help="name or id")
    p.set_defaults(handler=commands.keys_list)
    p = keys.add_parser("revoke")
    p.add_argument("key_id", type=int)
    p.set_defaults(handler=commands.keys_revoke)


def _adapter_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    adapters = sub.add_parser("adapters", help="manage LoRA adapters").add_subparsers(
        dest="adapters_command", required=True
    )
    p = adapters.add_parser("add", help="register a local PEFT adapter directory")
    p.add_argument("--tenant", required=True, help="name or id")
    p.add_argument("--name", required=True)
    p.add_argument("--model", help="the base model directory (default: LORAPLEX_MODEL)")
    p.add_argument("dir")
    p.set_defaults(handler=commands.adapters_add)
    p = adapters.add_parser("list")
    p.add_argument("--tenant", help="name or id")
    p.set_defaults(handler=commands.adapters_list)
    p = adapters.add_parser("remove")
    p.add_argument("adapter_id", type=int)
    p.set_defaults(handler=commands.adapters_remove)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (LoraplexError, commands.CommandError, ValidationError) as e:
        if isinstance(e, ValidationError):
            message = "; ".join(
                f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()
            )
        else:
            message = e.message if isinstance(e, LoraplexError) else str(e)
        print(f"loraplex: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
