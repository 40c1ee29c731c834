"""The reference database of a data task: the pristine data files as SQLite tables, on the host.

Every CSV file becomes a table named after its stem (all columns text, as
written), every JSON-lines file a table with the union of its keys (values as
JSON scalars), and every SQLite file (`.db`, `.sqlite`) is attached under its
stem with its tables as they are. The reference queries of a task's check run
against this database with a few cleaning functions registered, so a query
states the data's documented rules (date formats, missing markers, sentinels)
without doing the parsing in SQL:

    iso_date(text)  -> 'YYYY-MM-DD' or NULL      (the formats in DATE_FORMATS)
    iso_time(text)  -> 'YYYY-MM-DD HH:MM:SS' or NULL
    num(text)       -> a float or NULL           ('', NA, N/A, null, '-', currency signs, thousands commas)
    norm(text)      -> trimmed, lower case, single spaces, or NULL

These are the verifier's own functions: the agent never gets them and has to
clean the data itself, as the workspace's README describes.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from datetime import datetime
from pathlib import PurePosixPath

from tryloop.tasks.families.check import DATA_UNREADABLE, CheckError

DATA_SUFFIXES = (".csv", ".jsonl", ".db", ".sqlite")
DATE_FORMATS = ("%Y-%m-%d", "%d/%m/%Y", "%b %d %Y", "%d %B %Y", "%Y%m%d")
TIME_FORMATS = ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%d %H:%M:%S", "%d/%b/%Y:%H:%M:%S +0000", "%d/%m/%Y %H:%M",
                "%Y-%m-%dT%H:%M:%S")
MISSING = {"", "na", "n/a", "null", "none", "-", "nan"}
_NUM_JUNK = re.compile(r"[$€£,\s]")


def iso_date(text: object) -> str | None:
    t = iso_time(text)
    return t[:10] if t else None


def iso_time(text: object) -> str | None:
    if text is None:
        return None
    s = str(text).strip()
    for fmt in TIME_FORMATS + DATE_FORMATS:
        try:
            return datetime.strptime(s, fmt).strftime("%Y-%m-%d %H:%M:%S")
        except ValueError:
            continue
    return None


def num(text: object) -> float | None:
    if text is None:
        return None
    if isinstance(text, int | float):
        return float(text)
    s = str(text).strip()
    if s.lower() in MISSING:
        return None
    try:
        return float(_NUM_JUNK.sub("", s))
    except ValueError:
        return None


def norm(text: object) -> str | None:
    if text is None:
        return None
    s = " ".join(str(text).split()).lower()
    return s or None


def _table_name(path: str) -> str:
    stem = PurePosixPath(path).stem
    name = re.sub(r"[^a-z0-9_]", "_", stem.lower())
    return name if name[:1].isalpha() else f"t_{name}"


def _sql_value(v: object) -> object:
    if v is None or isinstance(v, int | float | str):
        return v
    return json.dumps(v, sort_keys=True)  # nested values stay comparable as text


def _load_rows(conn: sqlite3.Connection, table: str, columns: list[str], rows: list[list[object]]) -> None:
    cols = ", ".join(f'"{c}"' for c in columns)
    conn.execute(f'CREATE TABLE "{table}" ({cols})')
    conn.executemany(f'INSERT INTO "{table}" VALUES ({", ".join("?" * len(columns))})', rows)


def reference_db(files: dict[str, bytes]) -> sqlite3.Connection:
    """An in-memory database of the data files in `files` (workspace path -> bytes).
    `CheckError(reason=data_unreadable)` names the file that cannot be read."""
    conn = sqlite3.connect(":memory:")
    for fn, f in (("iso_date", iso_date), ("iso_time", iso_time), ("num", num), ("norm", norm)):
        conn.create_function(fn, 1, f, deterministic=True)
    seen: set[str] = set()
    for path, data in sorted(files.items()):
        suffix = PurePosixPath(path).suffix
        if suffix not in DATA_SUFFIXES:
            continue
        table = _table_name(path)
        if table in seen:
            raise CheckError(f"{path}: a second data file named {table!r}", DATA_UNREADABLE)
        seen.add(table)
        try:
            if suffix == ".csv":
                reader = csv.reader(io.StringIO(data.decode("utf-8")))
                header = next(reader)
                rows = [r + [None] * (len(header) - len(r)) for r in reader]
                if any(len(r) != len(header) for r in rows):
                    raise ValueError("a row has more fields than the header")
                _load_rows(conn, table, header, rows)
            elif suffix == ".jsonl":
                recs = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
                if not all(isinstance(r, dict) for r in recs):
                    raise ValueError("every line must be a JSON object")
                columns = list(dict.fromkeys(k for r in recs for k in r))
                _load_rows(conn, table, columns, [[_sql_value(r.get(c)) for c in columns] for r in recs])
            else:
                conn.execute(f"ATTACH DATABASE ':memory:' AS \"{table}\"")
                if data:  # an empty file is an empty database, as sqlite3 opens it
                    conn.deserialize(data, name=table)
                conn.execute(f'SELECT count(*) FROM "{table}".sqlite_master').fetchone()
        except (ValueError, UnicodeDecodeError, StopIteration, csv.Error, sqlite3.Error, MemoryError) as e:
            raise CheckError(f"{path}: unreadable as {suffix[1:]}: {type(e).__name__}: {e}", DATA_UNREADABLE) from None
    if not seen:
        raise CheckError("the workspace has no data file (.csv, .jsonl, .db, .sqlite)", DATA_UNREADABLE)
    return conn


def run_query(conn: sqlite3.Connection, sql: str) -> list[tuple]:
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.Error as e:
        raise CheckError(f"reference query failed: {e}: {sql[:200]}", DATA_UNREADABLE) from None
