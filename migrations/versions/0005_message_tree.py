"""Messages form a tree: a parent per message, and the session's active leaf (the branch on show).

Each linear history becomes a chain: a message's parent is the message before it (by position), the session's
active leaf its last message; nothing else changes. The downgrade keeps each session's active branch and deletes the
other branches (a linear history cannot hold them).

Revision ID: 0005
Revises: 0004
Create Date: 2027-01-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

# correlated subqueries that SQLite and PostgreSQL both run
LINK_TO_PREVIOUS = """
UPDATE messages SET parent_id = (
    SELECT previous.id FROM messages AS previous
    WHERE previous.session_id = messages.session_id AND previous.position < messages.position
    ORDER BY previous.position DESC LIMIT 1
)
"""
LAST_MESSAGE_IS_ACTIVE = """
UPDATE chat_sessions SET active_leaf_id = (
    SELECT last.id FROM messages AS last WHERE last.session_id = chat_sessions.id
    ORDER BY last.position DESC LIMIT 1
)
"""


def upgrade() -> None:
    """Add messages.parent_id and chat_sessions.active_leaf_id; link each history into a chain."""
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("parent_id", sa.Integer(), nullable=True))
        batch.create_index(batch.f("ix_messages_parent_id"), ["parent_id"])
        batch.create_foreign_key(
            batch.f("fk_messages_parent_id_messages"), "messages", ["parent_id"], ["id"], ondelete="CASCADE"
        )
    with op.batch_alter_table("chat_sessions", recreate="never") as batch:  # a copy would cascade (see below)
        batch.add_column(sa.Column("active_leaf_id", sa.Integer(), nullable=True))
    op.execute(LINK_TO_PREVIOUS)
    op.execute(LAST_MESSAGE_IS_ACTIVE)


def downgrade() -> None:
    """Keep each session's active branch (root to active leaf), delete the other branches, drop the columns."""
    bind = op.get_bind()
    rows = bind.execute(sa.text("SELECT id, session_id, parent_id, position FROM messages")).all()
    leaves = dict(bind.execute(sa.text("SELECT id, active_leaf_id FROM chat_sessions")).all())
    parent_of = {row.id: row.parent_id for row in rows}
    newest: dict[str, tuple[int, int]] = {}  # session -> (position, id) of its newest message
    for row in rows:
        newest[row.session_id] = max(newest.get(row.session_id, (-1, -1)), (row.position, row.id))
    keep: set[int] = set()
    for session_id, (_, newest_id) in newest.items():
        leaf = leaves.get(session_id)
        node = leaf if leaf in parent_of else newest_id
        while node is not None:
            keep.add(node)
            node = parent_of[node]
    dropped = [row.id for row in rows if row.id not in keep]
    for start in range(0, len(dropped), 500):
        chunk = dropped[start : start + 500]
        bind.execute(
            sa.text("DELETE FROM messages WHERE id IN :ids").bindparams(sa.bindparam("ids", expanding=True)),
            {"ids": chunk},
        )
    # ALTER TABLE DROP COLUMN (SQLite 3.35+), never a copy of the table: with foreign keys on, dropping the old
    # chat_sessions would cascade to every message
    with op.batch_alter_table("chat_sessions", recreate="never") as batch:
        batch.drop_column("active_leaf_id")
    with op.batch_alter_table("messages") as batch:
        batch.drop_constraint(batch.f("fk_messages_parent_id_messages"), type_="foreignkey")
        batch.drop_index(batch.f("ix_messages_parent_id"))
        batch.drop_column("parent_id")
