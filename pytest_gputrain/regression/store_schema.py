"""The benchmark store's tables, written once: each backend renders them in its SQL dialect.

Three tables (PostgreSQL keeps them in its own schema, ``gputrain``)::

    gputrain_schema (application, version, created_at)   the marker: which program, which schema
    runs    (id, name, created_at, fingerprint, fingerprint_hash, git_commit)
    results (id, run_id, nodeid, created_at, fingerprint, fingerprint_hash, rounds,
             metrics  -- JSON: per-round arrays {"step_time": [...], "throttled": [...], ...}
             summary) -- JSON: medians, spreads, throttled count, device, timer, conditions

The names are what stores already written hold: a change here is a new ``SCHEMA_VERSION``.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 1
MARKER_TABLE = "gputrain_schema"


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "text", "integer", "key" (the table's own id) or "reference" (another's id)
    nullable: bool = False
    references: str | None = None  # the table a "reference" points at (deleting it cascades)


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    unique: tuple[str, ...] = ()


@dataclass(frozen=True)
class Index:
    name: str
    table: str
    column: str


TABLES: tuple[Table, ...] = (
    Table(MARKER_TABLE, (
        Column("application", "text"),
        Column("version", "integer"),
        Column("created_at", "text"),
    )),
    Table("runs", (
        Column("id", "key"),
        Column("name", "text"),
        Column("created_at", "text"),
        Column("fingerprint", "text"),
        Column("fingerprint_hash", "text"),
        Column("git_commit", "text", nullable=True),
    )),
    Table("results", (
        Column("id", "key"),
        Column("run_id", "reference", references="runs"),
        Column("nodeid", "text"),
        Column("created_at", "text"),
        Column("fingerprint", "text"),
        Column("fingerprint_hash", "text"),
        Column("rounds", "integer"),
        Column("metrics", "text"),
        Column("summary", "text"),
    ), unique=("run_id", "nodeid")),
)
INDEXES: tuple[Index, ...] = (
    Index("runs_name", "runs", "name"),
    Index("results_nodeid", "results", "nodeid"),
)
# The tables a store of ours must hold besides the marker.
DATA_TABLES = frozenset(table.name for table in TABLES if table.name != MARKER_TABLE)


@dataclass(frozen=True)
class Dialect:
    """What differs between the backends: how an id is made, and where the tables live."""

    key: str  # the type of a table's own id column, primary key included
    reference: str  # the type of a column holding another table's id
    schema: str | None = None  # the schema the tables are created in (PostgreSQL's)

    @property
    def prefix(self) -> str:
        return f"{self.schema}." if self.schema else ""


def _column(column: Column, dialect: Dialect) -> str:
    if column.kind == "key":
        return f"{column.name} {dialect.key}"
    if column.kind == "reference":
        return (f"{column.name} {dialect.reference} NOT NULL REFERENCES "
                f"{dialect.prefix}{column.references}(id) ON DELETE CASCADE")
    kind = {"text": "TEXT", "integer": "INTEGER"}[column.kind]
    return f"{column.name} {kind}" + ("" if column.nullable else " NOT NULL")


def create_statements(dialect: Dialect) -> list[str]:
    """``CREATE TABLE`` and ``CREATE INDEX`` for every table and index, in order."""
    statements = []
    for table in TABLES:
        parts = [_column(column, dialect) for column in table.columns]
        if table.unique:
            parts.append(f"UNIQUE ({', '.join(table.unique)})")
        body = ",\n    ".join(parts)
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {dialect.prefix}{table.name} (\n    {body}\n)")
    statements.extend(f"CREATE INDEX IF NOT EXISTS {index.name} ON "
                      f"{dialect.prefix}{index.table}({index.column})" for index in INDEXES)
    return statements


def insert_marker(dialect: Dialect) -> str:
    """The marker row's INSERT, with ``?`` placeholders (application, version, created_at)."""
    return (f"INSERT INTO {dialect.prefix}{MARKER_TABLE} (application, version, created_at) "
            "VALUES (?, ?, ?)")
