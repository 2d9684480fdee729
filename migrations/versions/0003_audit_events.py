"""audit log: one row per admin mutation (actor, action, target, result, request id, detail)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ACTIONS = (
    "action IN ('tenant.create', 'tenant.update', 'tenant.delete', 'key.create', 'key.revoke', "
    "'adapter.upload', 'adapter.delete', 'grant.create', 'grant.delete')"
)


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("target_type", sa.String(length=16), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=True),
        sa.Column("result", sa.String(length=16), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.CheckConstraint(_ACTIONS, name=op.f("ck_audit_events_action")),
        sa.CheckConstraint(
            "target_type IN ('tenant', 'api_key', 'adapter')",
            name=op.f("ck_audit_events_target_type"),
        ),
        sa.CheckConstraint("result IN ('ok', 'failed')", name=op.f("ck_audit_events_result")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    op.create_index(op.f("ix_audit_events_created_at"), "audit_events", ["created_at"])
    op.create_index(op.f("ix_audit_events_actor"), "audit_events", ["actor"])
    op.create_index(
        "ix_audit_events_target_type_target_id", "audit_events", ["target_type", "target_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_audit_events_target_type_target_id", table_name="audit_events")
    op.drop_index(op.f("ix_audit_events_actor"), table_name="audit_events")
    op.drop_index(op.f("ix_audit_events_created_at"), table_name="audit_events")
    op.drop_table("audit_events")
