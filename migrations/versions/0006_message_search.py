"""Full-text search over messages: an FTS5 index kept in step with `messages` by triggers (SQLite), a tsvector column
with a GIN index (PostgreSQL).

The index is external-content (it reads the text back from `messages.content` by rowid = messages.id, so it holds no
second copy). A reply is indexed once it ends, not while it streams: each flush of a streaming reply would otherwise
index its whole text again (5 ms a flush for a 9 KB reply against 0.3 ms without, on the store's one writer thread).
So the index holds exactly the rows whose status is not 'streaming' (FTS5's 'rebuild' would index them all: not to
be used here); the messages already stored are indexed below.

PostgreSQL: `messages.search_vector`, a stored generated column (the database keeps it in step with every write, no
trigger), NULL while a reply streams, under a GIN index. Its text search configuration `pagedchat_search` folds
case and accents (the `unaccent` extension, trusted: a database owner may create it) and stems English words
(Snowball) without dropping stop words, as SQLite's porter + unicode61 do; punctuation separates words (SQLite's
tokenizer splits `example.com`, `<b>` and `snake_case` into words, PostgreSQL's parser would keep the first as one
host name and drop the second as a tag). Adding the column computes it for the messages already stored. Other
databases get nothing: their search answers "not supported on this database" (app/db/search.py).

A later migration that rebuilds `messages` in SQLite's batch mode (copy, drop, rename) drops these triggers with the
old table: it must create them again (tests/app/db/test_search_store.py checks the index at head).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-20
"""

from __future__ import annotations

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

# porter: "running" finds "run"; unicode61 with remove_diacritics 2: case and accents folded ("café" finds "cafe")
CREATE_INDEX = """
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, content='messages', content_rowid='id', tokenize='porter unicode61 remove_diacritics 2'
)
"""
# An external-content index forgets a row by being told the text it indexed: the old row's, in the same statement.
# One update trigger does both steps in this order (two triggers would fire in an order SQLite does not promise).
CREATE_TRIGGERS = (
    """
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages WHEN new.status != 'streaming' BEGIN
        INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
    END
    """,
    """
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages WHEN old.status != 'streaming' BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    END
    """,
    """
    CREATE TRIGGER messages_fts_update AFTER UPDATE OF id, content, status ON messages BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, content)
            SELECT 'delete', old.id, old.content WHERE old.status != 'streaming';
        INSERT INTO messages_fts (rowid, content) SELECT new.id, new.content WHERE new.status != 'streaming';
    END
    """,
)
TRIGGERS = ("messages_fts_insert", "messages_fts_delete", "messages_fts_update")

# PostgreSQL (the names are app/db/pg_search.py's)
PG_CONFIG = "pagedchat_search"
PG_STEMMER = "pagedchat_english_stem"
PG_COLUMN = "search_vector"
PG_INDEX = "ix_messages_search_vector"
PG_CREATE = (
    "CREATE EXTENSION IF NOT EXISTS unaccent",
    # the english configuration's stemmer drops stop words ("the", "at"): this one keeps them, as FTS5 does
    f"CREATE TEXT SEARCH DICTIONARY {PG_STEMMER} (TEMPLATE = snowball, Language = english)",
    f"CREATE TEXT SEARCH CONFIGURATION {PG_CONFIG} (COPY = english)",
    f"""ALTER TEXT SEARCH CONFIGURATION {PG_CONFIG}
        ALTER MAPPING FOR asciiword, asciihword, hword_asciipart, word, hword, hword_part WITH unaccent, {PG_STEMMER}
    """,
    f"""ALTER TABLE messages ADD COLUMN {PG_COLUMN} tsvector GENERATED ALWAYS AS (
        CASE WHEN status = 'streaming' THEN NULL
        ELSE to_tsvector('{PG_CONFIG}'::regconfig, regexp_replace(content, '[[:punct:]]+', ' ', 'g')) END
    ) STORED""",
    f"CREATE INDEX {PG_INDEX} ON messages USING gin ({PG_COLUMN})",
    # the new column has no statistics until autovacuum gets to it: without them the planner reads every message
    # for a common word (1 s against 30 ms, 50,000 messages)
    "ANALYZE messages",
)
# the unaccent extension stays: another schema or application of the database may use it
PG_DROP = (
    f"DROP INDEX IF EXISTS {PG_INDEX}",
    f"ALTER TABLE messages DROP COLUMN IF EXISTS {PG_COLUMN}",
    f"DROP TEXT SEARCH CONFIGURATION IF EXISTS {PG_CONFIG}",
    f"DROP TEXT SEARCH DICTIONARY IF EXISTS {PG_STEMMER}",
)


def upgrade() -> None:
    """Create the index (SQLite: and its triggers, and index every stored message that is not streaming)."""
    dialect = op.get_context().dialect.name
    if dialect == "postgresql":
        for statement in PG_CREATE:
            op.execute(statement)
        return
    if dialect != "sqlite":
        return
    op.execute(CREATE_INDEX)
    for statement in CREATE_TRIGGERS:
        op.execute(statement)
    op.execute(
        "INSERT INTO messages_fts (rowid, content) SELECT id, content FROM messages WHERE status != 'streaming'"
    )


def downgrade() -> None:
    """Drop the index (SQLite: the triggers and the FTS5 table, whose shadow tables go with it)."""
    dialect = op.get_context().dialect.name
    if dialect == "postgresql":
        for statement in PG_DROP:
            op.execute(statement)
        return
    if dialect != "sqlite":
        return
    for name in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute("DROP TABLE IF EXISTS messages_fts")
