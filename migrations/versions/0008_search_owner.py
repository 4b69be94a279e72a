"""Search cost follows the owner's own messages, not how common a word is in everyone's (issue #35, item 12).

SQLite: FTS5 reads a word's whole posting list for a MATCH, so an owner-scoped search took as long as the word was
common across all users (16.8 ms against 5.6 ms with 20,000 matches in another user's chats): a timing side channel.
The index is rebuilt with rowids that put each owner's messages in a range of their own, `search_key` =
owner number << 40 | message id (`search_owners` numbers the owners), and a search asks FTS5 for the owner's range
only: its doclists are entered at the range's start (their own b-tree), so other owners' postings are skipped, not
read. `messages.search_key` is the index's content rowid (FTS5 reads snippets back by it), set by the insert
trigger; a message's key follows its session's owner (a trigger re-keys a session whose owner changes).

PostgreSQL: no schema change; the query reads the owner's messages first (app/db/pg_search.py), so the GIN index on
`search_vector` is never used by a search any more and is dropped (every insert paid for it).

Limits: 2^23 owners with chats and message ids below 2^40; past them an insert fails with a message saying so.
A later migration that rebuilds `messages` in SQLite's batch mode must create this one's triggers again.

Revision ID: 0008
Revises: 0007
Create Date: 2027-02-01
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

KEY_SHIFT = 40
MAX_OWNERS = 1 << (63 - KEY_SHIFT)  # the key stays a positive 64-bit integer
MAX_MESSAGE_ID = 1 << KEY_SHIFT
_OWNER_NUM = (
    "(SELECT o.num FROM chat_sessions AS c JOIN search_owners AS o ON o.owner = c.owner WHERE c.id = {sid})"
)

CREATE_OWNERS = "CREATE TABLE search_owners (num INTEGER PRIMARY KEY, owner VARCHAR(128) NOT NULL UNIQUE)"
CREATE_INDEX = """
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, content='messages', content_rowid='search_key', tokenize='porter unicode61 remove_diacritics 2'
)
"""
KEY_ALL = (
    f"UPDATE messages SET search_key = ({_OWNER_NUM.format(sid='messages.session_id')} << {KEY_SHIFT}) | id"
)
INDEX_ALL = "INSERT INTO messages_fts (rowid, content) SELECT search_key, content FROM messages WHERE status != 'streaming'"
_NEW_KEY = f"({_OWNER_NUM.format(sid='new.session_id')} << {KEY_SHIFT}) | new.id"
CREATE_TRIGGERS = (
    f"""
    CREATE TRIGGER search_owner_insert AFTER INSERT ON chat_sessions BEGIN
        INSERT OR IGNORE INTO search_owners (owner) VALUES (new.owner);
        SELECT RAISE(ABORT, 'search index: {MAX_OWNERS} owners, its limit, already have chats')
            WHERE (SELECT num FROM search_owners WHERE owner = new.owner) >= {MAX_OWNERS};
    END
    """,
    f"""
    CREATE TRIGGER search_owner_update AFTER UPDATE OF owner ON chat_sessions BEGIN
        INSERT OR IGNORE INTO search_owners (owner) VALUES (new.owner);
        INSERT INTO messages_fts (messages_fts, rowid, content)
            SELECT 'delete', search_key, content FROM messages WHERE session_id = new.id AND status != 'streaming';
        UPDATE messages SET search_key = ((SELECT num FROM search_owners WHERE owner = new.owner) << {KEY_SHIFT}) | id
            WHERE session_id = new.id;
        INSERT INTO messages_fts (rowid, content)
            SELECT search_key, content FROM messages WHERE session_id = new.id AND status != 'streaming';
    END
    """,
    f"""
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        SELECT RAISE(ABORT, 'search index: message ids reach {MAX_MESSAGE_ID}, its limit')
            WHERE new.id >= {MAX_MESSAGE_ID};
        UPDATE messages SET search_key = {_NEW_KEY} WHERE id = new.id;
        INSERT INTO messages_fts (rowid, content)
            SELECT search_key, new.content FROM messages WHERE id = new.id AND new.status != 'streaming';
    END
    """,
    """
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages WHEN old.status != 'streaming' BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.search_key, old.content);
    END
    """,
    # forget the old text under the old key, re-key a message that moved, index the new text (one trigger: two
    # would fire in an order SQLite does not promise); setting search_key fires none of these again
    f"""
    CREATE TRIGGER messages_fts_update AFTER UPDATE OF id, session_id, content, status ON messages BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, content)
            SELECT 'delete', old.search_key, old.content WHERE old.status != 'streaming';
        UPDATE messages SET search_key = {_NEW_KEY}
            WHERE id = new.id AND (new.id != old.id OR new.session_id != old.session_id);
        INSERT INTO messages_fts (rowid, content)
            SELECT search_key, new.content FROM messages WHERE id = new.id AND new.status != 'streaming';
    END
    """,
)
TRIGGERS = (
    "search_owner_insert",
    "search_owner_update",
    "messages_fts_insert",
    "messages_fts_delete",
    "messages_fts_update",
)
PG_INDEX = "ix_messages_search_vector"
PG_COLUMN = "search_vector"


def _migration_0006() -> ModuleType:
    """Migration 0006, whose index and triggers the downgrade puts back."""
    path = Path(__file__).with_name("0006_message_search.py")
    spec = importlib.util.spec_from_file_location("migration_0006", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _drop_0006_index() -> None:
    for name in _migration_0006().TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute("DROP TABLE IF EXISTS messages_fts")


def upgrade() -> None:
    """SQLite: number the owners, key every message, rebuild the index on the keys; PostgreSQL: drop the GIN index."""
    dialect = op.get_context().dialect.name
    if dialect == "postgresql":
        op.execute(f"DROP INDEX IF EXISTS {PG_INDEX}")
        return
    if dialect != "sqlite":
        return
    _drop_0006_index()
    op.execute(CREATE_OWNERS)
    op.execute("INSERT INTO search_owners (owner) SELECT DISTINCT owner FROM chat_sessions ORDER BY owner")
    op.execute("ALTER TABLE messages ADD COLUMN search_key INTEGER")  # in place: no copy of the table
    op.execute(KEY_ALL)
    op.execute("CREATE UNIQUE INDEX ix_messages_search_key ON messages (search_key)")
    op.execute(CREATE_INDEX)
    for statement in CREATE_TRIGGERS:
        op.execute(statement)
    op.execute(INDEX_ALL)


def downgrade() -> None:
    """Back to 0006's index on message ids (SQLite) or its GIN index (PostgreSQL)."""
    dialect = op.get_context().dialect.name
    if dialect == "postgresql":
        op.execute(f"CREATE INDEX IF NOT EXISTS {PG_INDEX} ON messages USING gin ({PG_COLUMN})")
        return
    if dialect != "sqlite":
        return
    for name in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute("DROP TABLE IF EXISTS messages_fts")
    op.execute("DROP INDEX IF EXISTS ix_messages_search_key")
    op.execute("ALTER TABLE messages DROP COLUMN search_key")
    op.execute("DROP TABLE IF EXISTS search_owners")
    m0006 = _migration_0006()
    op.execute(m0006.CREATE_INDEX)
    for statement in m0006.CREATE_TRIGGERS:
        op.execute(statement)
    op.execute(
        "INSERT INTO messages_fts (rowid, content) SELECT id, content FROM messages WHERE status != 'streaming'"
    )
