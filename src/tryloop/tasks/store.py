"""The task store: content-addressed task versions under any fsspec URL.

    <url>/tasks/<id as a__b>/<fingerprint>/    one task version (the task directory)
    <url>/index/<fingerprint>.json             its metadata, gate summary and time added
    <url>/stats/<fingerprint>.json             measured pass rates per policy
    <url>/rejections.jsonl                     every rejected candidate and why

A local directory is the default; `s3://bucket/prefix` or any other fsspec URL
works the same. Old versions stay addressable by fingerprint; `get(id)` gives
the newest.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from pydantic import ValidationError

from tryloop.errors import ConfigError, InputMissing, TryloopError
from tryloop.tasks.model import Task, TaskMeta


class TaskNotFound(TryloopError, KeyError):
    def __init__(self, key: str, url: str):
        super().__init__(f"no task {key!r} in the task store at {url}")
        self.key = key

    def __str__(self) -> str:
        return self.args[0]


class StoreCorrupt(TryloopError):
    """A file of the task store cannot be read; the message names it."""

    exit_code = 65  # sysexits.h EX_DATAERR


@dataclass(frozen=True)
class Entry:
    """One task version as the index records it."""

    id: str
    fingerprint: str
    meta: TaskMeta
    added: float
    gate: dict[str, Any]

    @property
    def short(self) -> str:
        return self.fingerprint[:12]


def _key(task_id: str) -> str:
    return task_id.replace("/", "__")


class TaskStore:
    def __init__(self, url: str | Path, cache_dir: Path | None = None, *, create: bool = True,
                 setting: str = "tasks.store_url"):
        """The store at `url` (`setting` names where the URL came from, for errors). With
        `create` false it must exist already: commands that only read never make one where a
        path was mistyped."""
        self.url = str(url)
        if not self.url.strip():  # "" would make the current directory a task store
            raise ConfigError(f"{setting}: empty; give the task store's path or URL")
        self.fs, self.base = fsspec.core.url_to_fs(self.url)
        self.local = isinstance(self.fs, LocalFileSystem)
        self.cache_dir = cache_dir or Path(tempfile.gettempdir()) / "tryloop-task-cache"
        if not create:
            if not self.fs.isdir(self.base):
                what = "not a directory" if self.fs.exists(self.base) else "no such directory"
                raise InputMissing(f"{setting}: no task store at {self.url} ({what}); `tryloop tasks build-default` "
                                   "or `tryloop tasks import` make one")
            return
        try:
            for sub in ("tasks", "index", "stats", "builds"):
                self.fs.makedirs(f"{self.base}/{sub}", exist_ok=True)
        except (FileExistsError, NotADirectoryError) as e:
            raise ConfigError(f"{setting}: {self.url} cannot be a task store: {e.filename or self.url} is "
                              "not a directory") from None

    def __repr__(self) -> str:
        return f"<TaskStore {self.url}>"

    # ---- writing -------------------------------------------------------------

    def add(self, task: Task, gate: dict[str, Any] | None = None) -> Entry:
        """Store a task version. Content already stored (same fingerprint, whatever the id)
        is an exact duplicate: the existing entry is returned and nothing is written."""
        fp = task.fingerprint()
        if self.has(fp):
            return self.entry(fp)
        dest = f"{self.base}/tasks/{_key(task.id)}/{fp}"
        if self.local:
            tmp = Path(f"{dest}.tmp{time.monotonic_ns()}")
            shutil.copytree(task.root, tmp, symlinks=True)
            if Path(dest).exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        else:
            self.fs.put(str(task.root), dest, recursive=True)
        entry = Entry(task.id, fp, task.meta, time.time(), gate or {})
        # The index entry is written last: a task is in the store once it is complete.
        self._write_json(f"index/{fp}.json", {"id": task.id, "fingerprint": fp, "added": entry.added,
                                              "gate": entry.gate, "meta": task.meta.model_dump(mode="json")})
        return entry

    def has(self, fingerprint: str) -> bool:
        return self.fs.exists(f"{self.base}/index/{fingerprint}.json")

    def update_meta(self, fingerprint: str, **changes: Any) -> Entry:
        """Change metadata that does not decide grading (split, tier, tags, difficulty)."""
        entry = self.entry(fingerprint)
        meta = entry.meta.model_copy(update=changes)
        if meta.grading_fields() != entry.meta.grading_fields():
            raise TryloopError(f"task {entry.id}: {sorted(changes)} change grading; add a new version instead")
        doc = self._read_json(f"index/{fingerprint}.json")
        doc["meta"] = meta.model_dump(mode="json")
        self._write_json(f"index/{fingerprint}.json", doc)
        return Entry(entry.id, fingerprint, meta, entry.added, entry.gate)

    def record_rejection(self, task_id: str, source: str, group: str, reason: str, detail: str = "") -> None:
        line = json.dumps({"id": task_id, "source": source, "group": group, "reason": reason,
                           "detail": detail, "time": time.time()})
        with self.fs.open(f"{self.base}/rejections.jsonl", "a") as f:
            f.write(line + "\n")

    def record_pass_rate(self, fingerprint: str, policy: str, passes: int, attempts: int) -> dict[str, Any]:
        """Accumulate a policy's measured pass rate on one task version."""
        path = f"stats/{fingerprint}.json"
        doc = self._read_json(path) if self.fs.exists(f"{self.base}/{path}") else {}
        cur = doc.get(policy, {"passes": 0, "attempts": 0})
        cur = {"passes": cur["passes"] + passes, "attempts": cur["attempts"] + attempts}
        cur["rate"] = cur["passes"] / cur["attempts"] if cur["attempts"] else None
        doc[policy] = cur
        self._write_json(path, doc)
        return cur

    def pass_rates(self, fingerprint: str) -> dict[str, Any]:
        path = f"stats/{fingerprint}.json"
        return self._read_json(path) if self.fs.exists(f"{self.base}/{path}") else {}

    def remove(self, fingerprint: str) -> None:
        entry = self.entry(fingerprint)
        self.fs.rm(f"{self.base}/index/{fingerprint}.json")
        self.fs.rm(f"{self.base}/tasks/{_key(entry.id)}/{fingerprint}", recursive=True)

    def set_build_state(self, source: str, state: str, key: str | None = None) -> None:
        """Record how far a build of `source`'s default tasks got: "started", then "done", and what
        it was built from (`key`: the builder's, where its source changes between releases). A build
        admits task by task, so a store whose build was interrupted holds a part of the source."""
        self._write_json(f"builds/{source}.json", {"source": source, "state": state, "key": key,
                                                   "time": time.time()})

    # ---- reading -------------------------------------------------------------

    def _build_record(self, source: str) -> dict[str, Any] | None:
        """The recorded build of `source` (None where none was recorded)."""
        path = f"builds/{source}.json"
        return self._read_json(path) if self.fs.exists(f"{self.base}/{path}") else None

    def build_state(self, source: str) -> str | None:
        """How far the recorded build of `source` got: "started", "done", or None where none was
        recorded (none ran, or the tasks were added by hand)."""
        record = self._build_record(source)
        if record is None:
            return None
        state = record.get("state")
        if state not in ("started", "done"):
            raise StoreCorrupt(f"task store file {self.base}/builds/{source}.json: state is {state!r}, not 'started' "
                               "or 'done'; remove it to have the source's build treated as hand-made, or set it")
        return state

    def build_key(self, source: str) -> str | None:
        """What the recorded build of `source` was made from (None: not recorded)."""
        return (self._build_record(source) or {}).get("key")

    def decided_ids(self, source: str) -> set[str]:
        """Ids of `source` the store has admitted or rejected: what a resumed build does not gate again."""
        return ({e.id for e in self.entries() if e.meta.source == source}
                | {r["id"] for r in self.rejections() if r["source"] == source})

    def entries(self) -> list[Entry]:
        out = []
        for path in sorted(self.fs.glob(f"{self.base}/index/*.json")):
            out.append(self._entry(path))
        return out

    def entry(self, fingerprint: str) -> Entry:
        found = self._indexed(fingerprint)
        if found is not None:
            return found
        matches = [e for e in self.entries() if e.fingerprint.startswith(fingerprint)]
        if len(matches) != 1:
            raise TaskNotFound(fingerprint, self.url)
        return matches[0]

    def query(self, *, source: str | None = None, family: str | None = None, project: str | None = None,
              tags: Iterable[str] = (), tier: str | None = None, split: str | None = None,
              latest: bool = True) -> list[Entry]:
        """Entries matching every given filter; with `latest`, only each id's newest version."""
        tags = set(tags)
        out = [e for e in self.entries()
               if (source is None or e.meta.source == source) and (family is None or e.meta.family == family)
               and (project is None or e.meta.project == project) and tags <= set(e.meta.tags)
               and (tier is None or e.meta.tier == tier) and (split is None or e.meta.split == split)]
        if latest:
            newest: dict[str, Entry] = {}
            for e in out:
                if e.id not in newest or e.added > newest[e.id].added:
                    newest[e.id] = e
            out = sorted(newest.values(), key=lambda e: e.id)
        return out

    def versions(self, task_id: str) -> list[Entry]:
        return sorted((e for e in self.entries() if e.id == task_id), key=lambda e: e.added)

    def get(self, task_id_or_fp: str) -> Task:
        """A task by id (newest version) or by (a prefix of) its fingerprint, as a local directory."""
        # A whole fingerprint first: its own index file, not the whole index (callers loading a
        # suite by its entries' fingerprints would read that once per task).
        entry = self._indexed(task_id_or_fp)
        if entry is None:
            vs = self.versions(task_id_or_fp)
            entry = vs[-1] if vs else self.entry(task_id_or_fp)
        remote = f"{self.base}/tasks/{_key(entry.id)}/{entry.fingerprint}"
        if self.local:
            local = Path(remote)
        else:
            local = self.cache_dir / entry.fingerprint
            if not local.exists():
                tmp = self.cache_dir / f".{entry.fingerprint}.{time.monotonic_ns()}"
                self.fs.get(remote, str(tmp), recursive=True)
                tmp.rename(local)
        task = Task.load(local)
        # Metadata that does not decide grading (split, tier...) lives in the index.
        task.meta = entry.meta
        return task

    def rejections(self) -> list[dict[str, Any]]:
        path = f"{self.base}/rejections.jsonl"
        if not self.fs.exists(path):
            return []
        return [self._object(f"{path}, line {n}", self._parse(path, line, n))
                for n, line in enumerate(self.fs.cat_file(path).splitlines(), 1) if line.strip()]

    # ---- helpers ---------------------------------------------------------------

    def _indexed(self, fingerprint: str) -> Entry | None:
        """The entry of a whole fingerprint, read from its own index file (None: no such file)."""
        if len(fingerprint) != 64 or not self.has(fingerprint):
            return None
        return self._entry(f"{self.base}/index/{fingerprint}.json")

    def _entry(self, path: str) -> Entry:
        """The entry an index file records, or StoreCorrupt naming the file."""
        doc = self._parse(path)
        try:
            if not isinstance(doc, dict):
                raise TypeError(f"a JSON object is needed, not {type(doc).__name__}")
            gate = doc.get("gate", {})
            if not isinstance(doc["id"], str) or not isinstance(doc["fingerprint"], str) or not isinstance(gate, dict):
                raise TypeError("id and fingerprint must be strings, gate an object")
            return Entry(doc["id"], doc["fingerprint"], TaskMeta.model_validate(doc["meta"]), float(doc["added"]), gate)
        except KeyError as e:
            problem = f"no {e.args[0]!r} field"
        except ValidationError as e:
            problem = "; ".join(f"meta.{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        except (TypeError, ValueError) as e:
            problem = str(e)
        raise StoreCorrupt(f"task store file {path} is not an index entry ({problem}); it was changed outside "
                           "tryloop: restore it, or remove it and what it recorded with it")

    def _write_json(self, rel: str, doc: dict[str, Any]) -> None:
        path = f"{self.base}/{rel}"
        tmp = f"{path}.tmp{time.monotonic_ns()}"
        with self.fs.open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        self.fs.mv(tmp, path)

    def _read_json(self, rel: str) -> dict[str, Any]:
        return self._object(f"{self.base}/{rel}", self._parse(f"{self.base}/{rel}"))

    @staticmethod
    def _object(where: str, doc: Any) -> dict[str, Any]:
        """`doc` where every reader expects a JSON object, or StoreCorrupt naming the file."""
        if not isinstance(doc, dict):
            raise StoreCorrupt(f"task store file {where} holds a JSON {type(doc).__name__}, not an object; it was "
                               "changed outside tryloop: restore it, or remove it and what it recorded with it")
        return doc

    def _parse(self, path: str, text: str | bytes | None = None, line: int | None = None) -> Any:
        """JSON from a store file (or one line of it), or an error naming the file: a store is
        written atomically, so a bad file was damaged outside tryloop."""
        try:
            return json.loads(self.fs.cat_file(path) if text is None else text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            where = f"{path}, line {line}" if line else path
            raise StoreCorrupt(f"task store file {where} is not valid JSON ({e}); it was changed outside "
                               "tryloop: restore it, or remove it and what it recorded with it") from None
