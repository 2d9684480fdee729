"""Alembic, driven from code: `loraplex db upgrade`, and the start-up schema check."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

# migrations/ sits at the repository root, beside platform/ (an installed wheel has it as
# loraplex/migrations, beside loraplex/platform: the same relative place).
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


class DatabaseNotMigratedError(RuntimeError):
    """The database schema is not at the code's head revision."""


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Passed as an attribute, not an ini option: configparser would mangle '%' in passwords.
    config.attributes["database_url"] = database_url
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check_migrated(engine: Engine) -> None:
    """Refuse to serve from a schema the code does not expect; say how to fix it."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise DatabaseNotMigratedError(
            f"the database {engine.url.render_as_string(hide_password=True)} is at revision "
            f"{current or '(empty)'}, the code expects {head}: run `loraplex db upgrade`"
        )
