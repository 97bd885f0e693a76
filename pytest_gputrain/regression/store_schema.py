"""The benchmark store's tables, written once: each backend renders them in its SQL dialect.

Three tables (PostgreSQL keeps them in its own schema, ``gputrain``)::

    gputrain_schema (application, version, created_at)   the marker: which program, which schema
    runs    (id, name, created_at, fingerprint, fingerprint_hash, git_commit)
    results (id, run_id, nodeid, created_at, fingerprint, fingerprint_hash, rounds,
             metrics,  -- JSON: per-round arrays {"step_time": [...], "throttled": [...], ...}
             summary,  -- JSON: medians, spreads, throttled count, device, timer, conditions
             counters) -- JSON or NULL: the per-step counters of the counting pass (schema 2)

The names are what stores already written hold: a change here is a new ``SCHEMA_VERSION`` and
an entry in ``MIGRATIONS``, which brings a store of the version before up to it, adding what
is new and changing nothing already saved (``migration_statements``).
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 2
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
        Column("counters", "text", nullable=True),
    ), unique=("run_id", "nodeid")),
)
INDEXES: tuple[Index, ...] = (
    Index("runs_name", "runs", "name"),
    Index("results_nodeid", "results", "nodeid"),
)
# The tables a store of ours must hold besides the marker.
DATA_TABLES = frozenset(table.name for table in TABLES if table.name != MARKER_TABLE)


@dataclass(frozen=True)
class AddColumn:
    """A column added to a table (nullable: the rows already saved get NULL in it)."""

    table: str
    column: Column


# Each version's way up from the one before: version -> what turns a store of version - 1 into
# one of this version.
MIGRATIONS: dict[int, tuple[AddColumn, ...]] = {
    2: (AddColumn("results", Column("counters", "text", nullable=True)),),
}


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


def added_after(version: int, table: str) -> frozenset[str]:
    """The columns of ``table`` that the schemas after ``version`` added: what a store of
    ``version``, read without upgrading it (``open_for_reading``), does not have."""
    return frozenset(change.column.name for step, changes in MIGRATIONS.items()
                     if step > version for change in changes if change.table == table)


def migration_statements(dialect: Dialect, version: int) -> list[str]:
    """The statements that bring a store of ``version`` up to ``SCHEMA_VERSION``, in order,
    the marker's version last."""
    statements = []
    for step in range(version + 1, SCHEMA_VERSION + 1):
        for change in MIGRATIONS[step]:
            if not change.column.nullable:
                raise ValueError(f"schema {step} adds {change.column.name} NOT NULL: the rows "
                                 "already saved would have no value for it")
            statements.append(f"ALTER TABLE {dialect.prefix}{change.table} ADD COLUMN "
                              f"{_column(change.column, dialect)}")
    statements.append(f"UPDATE {dialect.prefix}{MARKER_TABLE} SET version = {SCHEMA_VERSION}")
    return statements


def insert_marker(dialect: Dialect) -> str:
    """The marker row's INSERT, with ``?`` placeholders (application, version, created_at)."""
    return (f"INSERT INTO {dialect.prefix}{MARKER_TABLE} (application, version, created_at) "
            "VALUES (?, ?, ?)")
