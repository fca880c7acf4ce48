"""Where sweep rows live: a crash-safe journal beside a Parquet or CSV table.

A Parquet file cannot be appended to in place, and a CSV's header cannot grow when a new
scheme brings new columns, so a sweep writing ``OUT`` (``results.parquet`` or
``results.csv``) keeps two files while it runs:

``OUT.journal.jsonl``
    one JSON object per finished point, appended and flushed the moment the point
    finishes (``fsync`` at most once a second and at the end), written only by the
    process that runs the sweep, never by its workers, so appends never interleave.
    A line torn by a crash is cut off when the journal is next opened.
``OUT``
    the whole table, rewritten atomically (temporary file, ``fsync``, rename) at the end of
    the sweep, when it is interrupted, and every minute while it runs; the journal is
    emptied after each rewrite and removed at the end.

Opening the store reads both (journal rows win), so a rerun after any interruption,
even ``kill -9``, loses no finished row. A lock file ``OUT.lock`` (``flock``) keeps two
sweeps from writing the same output at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from simcore.config import ConfigError
from traces.atomic import OutputPathError, atomic_path

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
"""Output file suffixes and their formats."""

READABLE = (*FORMATS, ".json", ".jsonl")
"""Suffixes :func:`read_table` understands (``.json``: a ``sim run --json`` object or a
list of them; ``.jsonl``: one object per line, e.g. a journal)."""

LAST = ("error", "spec")
"""Columns written last."""

FLATTENED = ("comm_bytes_by_link_kind", "memory_breakdown_bytes")
"""Result keys whose mappings (over a few link or memory kinds) become ``KEY.SUBKEY``
columns; every other list or mapping is stored as JSON text."""


def flatten_result(d: Mapping[str, Any]) -> dict[str, Any]:
    """A ``sim run --json`` object as one flat row: the mappings in :data:`FLATTENED`
    become ``KEY.SUBKEY`` columns, other lists and mappings JSON text, scalars stay."""
    row: dict[str, Any] = {}
    for k, v in d.items():
        if k in FLATTENED and isinstance(v, Mapping):
            for sub, x in v.items():
                row[f"{k}.{sub}"] = x
        elif isinstance(v, Mapping | list | tuple):
            row[k] = json.dumps(v, separators=(",", ":"))
        else:
            row[k] = v
    return row


def unflatten_row(row: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The ``sim run --json`` values of ``keys`` from a row: ``KEY.SUBKEY`` columns
    gathered back into mappings (missing and NaN entries left out), JSON text parsed."""
    out: dict[str, Any] = {}
    for k in keys:
        if k in FLATTENED:
            prefix = k + "."
            out[k] = {
                c[len(prefix) :]: v
                for c, v in row.items()
                if c.startswith(prefix) and not _is_missing(v)
            }
            continue
        v = row.get(k)
        if isinstance(v, str) and v[:1] in "[{":
            v = json.loads(v)
        out[k] = v
    return out


def output_format(path: str) -> str:
    """``parquet`` or ``csv`` from ``path``'s suffix (``ConfigError`` otherwise)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise ConfigError("out", path, "expected a file name ending in .parquet or .csv")
    return FORMATS[suffix]


def _drop_missing(rec: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in rec.items()
        if v is not None and not (isinstance(v, float) and math.isnan(v))
    }


def read_table(path: str) -> Any:
    """A results file as a pandas DataFrame: Parquet, CSV, a ``sim run --json`` file
    (one object or a list) or JSON lines. ``ConfigError`` when it cannot be read."""
    import pandas as pd

    suffix = os.path.splitext(path)[1].lower()
    if suffix not in READABLE:
        raise ConfigError("results", path, "expected a .parquet, .csv, .json or .jsonl file")
    if not os.path.exists(path):
        raise ConfigError("results", path, "does not exist")
    try:
        if FORMATS.get(suffix) == "parquet":
            return pd.read_parquet(path)
        if suffix == ".csv":
            df = pd.read_csv(path, dtype={"error": str})
            if "error" in df.columns:
                df["error"] = df["error"].fillna("")
            return df
        with open(path, encoding="utf-8") as fh:
            if suffix == ".jsonl":
                objs = [json.loads(line) for line in fh if line.strip()]
            else:
                data = json.load(fh)
                objs = data if isinstance(data, list) else [data]
        if not all(isinstance(o, dict) for o in objs):
            raise ValueError("expected JSON objects")
        return pd.DataFrame([flatten_result(o) for o in objs])
    except Exception as exc:  # OSError, JSON, pyarrow and pandas parser errors
        first = " ".join(str(exc).split())[:200]
        raise ConfigError("results", path, f"cannot be read as a results table ({first})") from None


def rows_frame(rows: Sequence[dict[str, Any]], first: Sequence[str] = ()) -> Any:
    """Rows as a DataFrame: columns ``first`` (those present), then the others in the
    order they first appear, then :data:`LAST`. Object columns mixing types (e.g. a
    scheme option given as ``4`` and ``4MiB``) are stored as text."""
    import pandas as pd

    order: dict[str, None] = dict.fromkeys(first)
    for r in rows:
        order.update(dict.fromkeys(r))
    present = {c for r in rows for c in r}
    cols = [c for c in order if c in present and c not in LAST]
    cols += [c for c in LAST if c in present]
    df = pd.DataFrame.from_records(list(rows), columns=cols)
    for c in df.columns:
        if df[c].dtype == object:
            kinds = {type(v) for v in df[c] if not _is_missing(v)}
            if len(kinds) > 1 and not kinds <= {int, float}:
                df[c] = df[c].map(lambda v: v if _is_missing(v) else str(v))
    return df


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


class SweepStore:
    """The rows of one sweep output (see module docs); use as a context manager.

    Attributes:
        out: the output path.
        format: ``parquet`` or ``csv``.
        rows: every row known, by ``point_id`` (loaded ones and appended ones).
    """

    FSYNC_EVERY_S = 1.0
    SAVE_EVERY_S = 60.0

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.out = os.fspath(out)
        self.format = output_format(self.out)
        self.journal_path = self.out + ".journal.jsonl"
        self.lock_path = self.out + ".lock"
        self.rows: dict[str, dict[str, Any]] = {}
        self._lock_fd = -1
        self._fh: Any = None
        self._synced = self._saved = time.monotonic()
        self.first: Sequence[str] = ("point_id", "status")
        """Columns written first (the sweep sets its swept fields here)."""

    # -- opening and closing --

    def __enter__(self) -> SweepStore:
        d = os.path.dirname(os.path.abspath(self.out))
        if not os.path.isdir(d):
            raise ConfigError("out", self.out, f"its folder {d} does not exist")
        self._lock()
        try:
            self._load()
            self._fh = open(self.journal_path, "ab", buffering=0)
        except BaseException:
            self._unlock()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._fh is not None:
                self._fh.flush()
                os.fsync(self._fh.fileno())
                empty = os.fstat(self._fh.fileno()).st_size == 0
                self._fh.close()
                self._fh = None
                if empty:
                    os.unlink(self.journal_path)
        finally:
            self._unlock()

    def _lock(self) -> None:
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ConfigError(
                    "out",
                    self.out,
                    "another sweep is writing it right now "
                    f"({self.lock_path}); wait for it or "
                    "choose another file",
                ) from None
            try:
                same = os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._lock_fd = fd
                return
            os.close(fd)  # the holder removed the file after we opened it: try again

    def _unlock(self) -> None:
        if self._lock_fd >= 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.lock_path)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _load(self) -> None:
        if os.path.exists(self.out):
            df = read_table(self.out)
            missing = [c for c in ("point_id", "status") if c not in df.columns]
            if missing:
                raise ConfigError(
                    "out",
                    self.out,
                    "exists and is not a sweep's output "
                    f"(no {missing[0]} column); choose "
                    "another file",
                )
            for rec in df.to_dict(orient="records"):
                rec = _drop_missing(rec)
                if rec.get("status") == "ok":
                    rec.setdefault("error", "")
                self.rows[str(rec["point_id"])] = rec
        if os.path.exists(self.journal_path):
            for row in self._read_journal():
                self.rows[str(row["point_id"])] = row

    def _read_journal(self) -> list[dict[str, Any]]:
        """Rows of the journal; a torn last line (a crash mid-write) is cut off."""
        with open(self.journal_path, "rb") as fh:
            data = fh.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with open(self.journal_path, "r+b") as fh:
                fh.truncate(end)
        rows = []
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # damaged line: that point simply runs again
            if isinstance(row, dict) and "point_id" in row:
                rows.append(row)
        return rows

    # -- writing --

    def append(self, row: dict[str, Any]) -> None:
        """Record a finished point: one journal line, written now. A write that fails (a
        full disk) leaves the journal as it was, without a torn line, and raises
        :class:`~traces.atomic.OutputPathError` naming the output."""
        data = (json.dumps(row, separators=(",", ":"), default=str) + "\n").encode()
        fd = self._fh.fileno()
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise OutputPathError(
                f"{self.out}: cannot write its journal {self.journal_path}: {exc.strerror or exc}"
            ) from None
        self.rows[str(row["point_id"])] = row
        now = time.monotonic()
        if now - self._synced >= self.FSYNC_EVERY_S:
            os.fsync(self._fh.fileno())
            self._synced = now
        if now - self._saved >= self.SAVE_EVERY_S:
            self.save()

    def save(self) -> None:
        """Rewrite the output with every row (columns :attr:`first` first), atomically,
        then empty the journal. Does nothing while there are no rows."""
        self._saved = time.monotonic()
        if not self.rows:
            return
        df = rows_frame(list(self.rows.values()), self.first)
        with atomic_path(self.out) as tmp:
            if self.format == "parquet":
                df.to_parquet(tmp, index=False)
            else:
                df.to_csv(tmp, index=False)
        if self._fh is not None:
            self._fh.flush()
            self._fh.truncate(0)
