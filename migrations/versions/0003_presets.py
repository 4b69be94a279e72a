"""Presets: named system prompts and sampling settings per owner, one of them the default; a chat may follow one.

Revision ID: 0003
Revises: 0002
Create Date: 2027-01-12
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Create presets; add chat_sessions.preset_id (a plain column: SQLite adds it in place, no table copy)."""
    op.create_table(
        "presets",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("is_default", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_presets")),
        sa.UniqueConstraint("owner", "name", name=op.f("uq_presets_owner_name")),
    )
    op.create_index(
        "ix_presets_owner_default",
        "presets",
        ["owner"],
        unique=True,
        sqlite_where=sa.text("is_default"),
        postgresql_where=sa.text("is_default"),
    )
    op.add_column("chat_sessions", sa.Column("preset_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    """Drop chat_sessions.preset_id (in place: SQLite 3.35+ drops a plain column) and presets."""
    op.drop_column("chat_sessions", "preset_id")
    op.drop_index("ix_presets_owner_default", table_name="presets")
    op.drop_table("presets")
