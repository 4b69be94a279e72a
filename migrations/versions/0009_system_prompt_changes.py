"""A chat's system prompt changes after its turns (`system_prompt_changes`): the export then shows each change where
it took effect (issue #39, item 6.5). A new table: no table is copied, on SQLite either.

Revision ID: 0009
Revises: 0008
Create Date: 2027-03-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Create system_prompt_changes (empty: earlier changes were not recorded)."""
    op.create_table(
        "system_prompt_changes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("previous", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["chat_sessions.id"],
            name=op.f("fk_system_prompt_changes_session_id_chat_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_system_prompt_changes")),
    )
    op.create_index(op.f("ix_system_prompt_changes_session_id"), "system_prompt_changes", ["session_id"])


def downgrade() -> None:
    """Drop the recorded changes (exports then show the current system prompt only, as before)."""
    op.drop_index(op.f("ix_system_prompt_changes_session_id"), table_name="system_prompt_changes")
    op.drop_table("system_prompt_changes")
