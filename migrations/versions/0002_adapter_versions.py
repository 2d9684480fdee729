"""adapter versions: name@vN rows, load-check statuses (loading, failed) with a reason

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES_OLD = "status IN ('ready', 'disabled')"
_STATUSES_NEW = "status IN ('loading', 'ready', 'failed', 'disabled')"


def upgrade() -> None:
    with op.batch_alter_table("adapters") as batch:
        # Every adapter registered so far is its name's first version.
        batch.add_column(sa.Column("version", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("status_reason", sa.String(length=1024), nullable=True))
        batch.drop_constraint("uq_adapters_tenant_id_name", type_="unique")
        batch.create_unique_constraint(
            "uq_adapters_tenant_id_name_version", ["tenant_id", "name", "version"]
        )
        batch.drop_constraint(op.f("ck_adapters_status"), type_="check")
        batch.create_check_constraint(op.f("ck_adapters_status"), _STATUSES_NEW)
        batch.create_check_constraint(op.f("ck_adapters_version"), "version >= 1")
    with op.batch_alter_table("adapters") as batch:
        batch.alter_column("version", server_default=None)


def downgrade() -> None:
    # Only first versions fit the old schema's one row per name; the rest are dropped.
    op.execute("DELETE FROM adapters WHERE version > 1 OR status IN ('loading', 'failed')")
    with op.batch_alter_table("adapters") as batch:
        batch.drop_constraint(op.f("ck_adapters_version"), type_="check")
        batch.drop_constraint(op.f("ck_adapters_status"), type_="check")
        batch.create_check_constraint(op.f("ck_adapters_status"), _STATUSES_OLD)
        batch.drop_constraint("uq_adapters_tenant_id_name_version", type_="unique")
        batch.create_unique_constraint("uq_adapters_tenant_id_name", ["tenant_id", "name"])
        batch.drop_column("status_reason")
        batch.drop_column("version")
