"""Projects from a local directory or a git repository, and git workspaces without history.

    project_from_dir("path/to/project")            # tests and test command detected
    project_from_git("path/or/file://url", rev="v1.2", work_dir=tmp)

A project's files never carry VCS metadata (`Project.files()` skips `.git`).
When a task's workspace must be a git repository (so that the agent can run
`git diff`), `sanitize_git_workspace` makes it one orphan commit with a fixed
author and date and nothing else: no parents, refs, tags, remotes, stashes,
reflog or objects of another history, and an index without host stat data, so
the same files always give byte-identical `.git` contents.
`assert_clean_history` checks exactly that and names what leaked.

Every git command runs without the system and global git configuration
(hooks, templates, credential helpers and aliases of the host play no part) and
with `safe.directory=*`, so repositories owned by another user can be read.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tryloop.tasks.model import TaskError, _slugify
from tryloop.tasks.project import Project, ignored

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
TEST_DIRS = ("tests", "test")
# Fixed identity and date of a sanitized workspace's one commit: same files, same commit id.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "tryloop", "GIT_AUTHOR_EMAIL": "tryloop@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "tryloop", "GIT_COMMITTER_EMAIL": "tryloop@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
# Files in .git that name other history (a merge, a fetch, a rebase in progress...).
_STATE_FILES = ("ORIG_HEAD", "FETCH_HEAD", "MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD", "BISECT_LOG",
                "rebase-merge", "rebase-apply", "shallow", "info/grafts", "objects/info/alternates",
                "objects/info/http-alternates", "modules", "worktrees")


class SourceError(TaskError):
    """An importer could not turn its input into a project or task; the message says why."""


class HistoryLeak(SourceError):
    """A workspace's git repository holds more than its one initial commit."""

    def __init__(self, message: str, leaks: list[str]):
        super().__init__(message)
        self.leaks = leaks


# ---- git -------------------------------------------------------------------------------

def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every git command of the importers runs with (see module doc)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
                "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*",
                "LC_ALL": "C"})
    env.update(extra or {})
    return env


def git(args: Sequence[str], cwd: Path, *, check: bool = True, env: dict[str, str] | None = None,
        timeout: float = 300) -> str:
    """Run `git args` in `cwd`; return stdout. A failure raises SourceError with git's message."""
    try:
        res = subprocess.run(["git", *args], cwd=cwd, env=git_env(env), capture_output=True, text=True,
                             timeout=timeout)
    except FileNotFoundError:
        if shutil.which("git") is None:
            raise SourceError("git is not installed") from None
        raise SourceError(f"git {' '.join(args)}: no directory {cwd}") from None
    except subprocess.TimeoutExpired:
        raise SourceError(f"git {' '.join(args)} (in {cwd}) took more than {timeout:.0f}s") from None
    if check and res.returncode != 0:
        msg = (res.stderr or res.stdout).strip()
        raise SourceError(f"git {' '.join(args)} failed in {cwd}: {msg}")
    return res.stdout


def _require_repo(root: Path) -> Path:
    git_dir = root / ".git"
    if git_dir.is_file():
        raise HistoryLeak(f"{root}: .git is a file pointing to another repository "
                          f"({git_dir.read_text().strip()!r})", ["linked .git file"])
    if not git_dir.is_dir():
        raise SourceError(f"{root}: not a git repository (no .git directory)")
    return git_dir


# ---- local directories -----------------------------------------------------------------

def validate_name(name: str) -> str:
    """A project name is a slug: lowercase letters, digits, '.', '_', '-'."""
    if not _NAME_RE.match(name):
        raise SourceError(f"project name {name!r} must be lowercase letters, digits, '.', '_' or '-' "
                          "and start with a letter or digit")
    return name


def _is_test_file(name: str) -> bool:
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def detect_test_paths(root: Path) -> list[str]:
    """Where a project's tests are: `tests/` or `test/`, and `test_*.py` / `*_test.py` at the top
    level; failing those, `tests/` or `test/` one package down (`pkg/tests`, `src/pkg/tests`), and
    failing those, test modules in a package (`pkg/test_*.py`, as bitarray ships them)."""
    root = Path(root)
    paths = [d for d in TEST_DIRS if (root / d).is_dir()]
    paths += sorted(p.name for p in root.iterdir() if p.is_file() and _is_test_file(p.name))
    if paths:
        return paths
    parents = [p for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith(".")
               and not ignored(p.name)]
    if (root / "src").is_dir():
        parents += [p for p in sorted((root / "src").iterdir()) if p.is_dir() and not ignored(p.name)]
    paths = [f"{p.relative_to(root).as_posix()}/{d}" for p in parents for d in TEST_DIRS if (p / d).is_dir()]
    if paths:
        return paths
    return [f"{p.relative_to(root).as_posix()}/{f.name}" for p in parents if (p / "__init__.py").is_file()
            for f in sorted(p.iterdir()) if f.is_file() and _is_test_file(f.name)]


def is_src_layout(root: Path) -> bool:
    """Importable code lives in `src/` (a package or module there, none at the top level)."""
    src = Path(root) / "src"
    if not src.is_dir():
        return False
    in_src = any((p.is_dir() and (p / "__init__.py").is_file()) or (p.suffix == ".py" and p.is_file())
                 for p in src.iterdir())
    top = any(p.is_dir() and (p / "__init__.py").is_file() and p.name not in TEST_DIRS
              for p in Path(root).iterdir())
    return in_src and not top


def default_test_command(root: Path, test_paths: Sequence[str]) -> str:
    """`python3 -m pytest -q <paths>`, with `-o pythonpath=src` for a src layout.

    The project is not installed in the sandbox: `python3 -m` puts the working
    directory on sys.path, and pytest's `pythonpath` option adds `src/`. (A
    `PYTHONPATH=src` prefix would replace the PYTHONPATH that tryloop's test
    runner sets for its per-test report plugin.) Glob patterns among the paths
    are expanded here: the command is not run through a globbing shell.
    """
    root = Path(root)
    words = ["python3", "-m", "pytest", "-q"]
    if is_src_layout(root):
        words += ["-o", "pythonpath=src"]
    for p in test_paths:
        if any(c in p for c in "*?["):
            words += sorted(m.relative_to(root).as_posix() for m in root.glob(p) if not ignored(m.name))
        else:
            words.append(p)
    return shlex.join(words)


def project_from_dir(path: str | Path, *, name: str | None = None, test_command: str | None = None,
                     test_paths: Sequence[str] | None = None, source: str = "local",
                     origin: dict | None = None) -> Project:
    """A `Project` for a local directory, used in place (nothing is copied).

    `name` defaults to the directory's name as a slug; `test_paths` to
    `detect_test_paths`; `test_command` to `default_test_command`.
    """
    root = Path(path).resolve()
    if not root.is_dir():
        raise SourceError(f"{root}: not a directory")
    name = validate_name(name if name is not None else _slugify(root.name))
    paths = list(test_paths) if test_paths is not None else detect_test_paths(root)
    if not paths:
        raise SourceError(f"{root}: no tests found (looked for tests/, test/, test_*.py, *_test.py); "
                          "pass test_paths=")
    for p in paths:
        if Path(p).is_absolute() or ".." in Path(p).parts:
            raise SourceError(f"test path {p!r} must be relative to the project")
    command = test_command or default_test_command(root, paths)
    return Project(name=name, root=root, source=source, test_command=command, test_paths=paths,
                   origin=dict(origin) if origin is not None else {"path": str(root)})


# ---- git repositories ------------------------------------------------------------------

def clone_at(url_or_path: str | Path, rev: str, dest: Path) -> str:
    """Clone into `dest` (which must not exist) and check out `rev` (a commit, tag or branch of
    the source) detached; return the commit id."""
    src = str(url_or_path)
    if Path(src).exists():
        src = str(Path(src).resolve())
    dest = Path(dest).resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    git(["clone", "--quiet", "--no-local", "--no-checkout", "--", src, str(dest)], cwd=dest.parent)
    # In the clone the source's branches are origin/<name>; HEAD is the source's HEAD.
    for cand in ([rev] if rev == "HEAD" else [rev, f"origin/{rev}", f"refs/tags/{rev}"]):
        commit = git(["rev-parse", "--verify", "--quiet", f"{cand}^{{commit}}"], cwd=dest,
                     check=False).strip()
        if commit:
            break
    else:
        raise SourceError(f"{src}: no commit, branch or tag {rev!r}")
    git(["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit], cwd=dest)
    return commit


def _remove_git_dirs(root: Path) -> None:
    for p in sorted(root.rglob(".git"), reverse=True):  # the repository's own and nested ones
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def project_from_git(url_or_path: str | Path, *, rev: str = "HEAD", work_dir: str | Path | None = None,
                     name: str | None = None, test_command: str | None = None,
                     test_paths: Sequence[str] | None = None) -> Project:
    """Clone a git repository (a local path or a file:// URL work offline) at `rev` (a commit,
    tag or branch) into a new directory under `work_dir` and drop its `.git`."""
    src = str(Path(url_or_path).resolve()) if Path(url_or_path).exists() else str(url_or_path)
    base = Path(work_dir).resolve() if work_dir is not None else None
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    stem = src.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or "repo"
    dest = Path(tempfile.mkdtemp(prefix="git-", dir=base)) / (name or _slugify(stem))
    try:
        commit = clone_at(src, rev, dest)
    except BaseException:
        shutil.rmtree(dest.parent, ignore_errors=True)
        raise
    _remove_git_dirs(dest)
    return project_from_dir(dest, name=name or _slugify(stem), test_command=test_command,
                            test_paths=test_paths, source="git",
                            origin={"url": src, "rev": rev, "commit": commit})


# ---- history-free git workspaces -------------------------------------------------------

def _normalize_index(index: Path) -> None:
    """Zero the stat data (times, device, inode, owner) of a v2/v3 index and fix its checksum:
    the index then depends on the files' contents only. Git re-reads files whose stat data
    differs, so `git status` and `git diff` are unaffected (apart from one refresh)."""
    data = bytearray(index.read_bytes())
    sig, version, count = struct.unpack(">4sII", data[:12])
    if sig != b"DIRC" or version not in (2, 3):
        return
    off = 12
    for _ in range(count):
        data[off:off + 24] = bytes(24)        # ctime, mtime, dev, ino
        data[off + 28:off + 36] = bytes(8)    # uid, gid
        flags = struct.unpack(">H", data[off + 60:off + 62])[0]
        name_at = off + 62 + (2 if version == 3 and flags & 0x4000 else 0)
        name_end = data.index(b"\0", name_at)
        off += ((name_end - off) + 8) & ~7    # entries are NUL-padded to a multiple of 8
    data[-20:] = hashlib.sha1(bytes(data[:-20])).digest()
    index.write_bytes(bytes(data))


def sanitize_git_workspace(path: str | Path, *, branch: str = "main", message: str = "Initial state") -> str:
    """Make `path` a git repository of exactly one orphan commit of its current files; return the
    commit id.

    Any `.git` in the tree (the directory's own and nested ones) is removed first, so no object,
    ref, tag, remote, stash or reflog of another history survives. Every file is committed,
    including ones a `.gitignore` names, so the agent's `git diff` shows every change. Author,
    committer and dates are fixed: the same files always give the same commit id and the same
    bytes under `.git`.
    """
    root = Path(path)
    if not root.is_dir():
        raise SourceError(f"{root}: not a directory")
    _remove_git_dirs(root)
    git(["init", "--quiet", "--template=", f"--initial-branch={branch}"], cwd=root)
    git(["config", "core.logAllRefUpdates", "false"], cwd=root)
    git(["add", "--all", "--force", "."], cwd=root)
    git(["commit", "--quiet", "--no-verify", "--no-gpg-sign", "--allow-empty", "-m", message], cwd=root,
        env=GIT_IDENTITY)
    git(["reflog", "expire", "--expire=now", "--expire-unreachable=now", "--all"], cwd=root)
    git(["prune", "--expire=now"], cwd=root)
    git_dir = root / ".git"
    for leftover in ("COMMIT_EDITMSG", "logs"):
        p = git_dir / leftover
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    _normalize_index(git_dir / "index")
    assert_clean_history(root)
    return git(["rev-parse", "HEAD"], cwd=root).strip()


def _describe_ref(ref: str) -> str:
    for prefix, kind in (("refs/tags/", "tag"), ("refs/remotes/", "remote-tracking ref"),
                         ("refs/heads/", "branch"), ("refs/notes/", "notes ref"),
                         ("refs/replace/", "replace ref")):
        if ref.startswith(prefix):
            return f"{kind} {ref[len(prefix):]!r}"
    return "stash" if ref == "refs/stash" else f"ref {ref!r}"


def assert_clean_history(path: str | Path) -> str:
    """Check that the repository at `path` holds one orphan commit and nothing else; return its id.

    Leaks, all reported together in a `HistoryLeak`: more than one commit (or a commit with
    parents), refs besides HEAD's branch (tags, branches, remote-tracking refs, stash, notes;
    loose or in packed-refs), configured remotes, reflog entries, state files naming other
    commits (ORIG_HEAD, FETCH_HEAD, shallow, grafts, alternates...), and objects in the store
    that the commit does not reach.
    """
    root = Path(path)
    git_dir = _require_repo(root)
    leaks: list[str] = []
    for name in _STATE_FILES:
        if (git_dir / name).exists():
            leaks.append(f"{name} present")
    head_ref = git(["symbolic-ref", "--quiet", "HEAD"], cwd=root, check=False).strip()
    allowed = {head_ref} if head_ref else set()
    packed = git_dir / "packed-refs"
    packed_refs = set()
    if packed.is_file():
        packed_refs = {line.split()[1] for line in packed.read_text().splitlines()
                       if line and not line.startswith(("#", "^")) and len(line.split()) > 1}
    refs = git(["for-each-ref", "--format=%(refname)"], cwd=root).split()
    for ref in refs:
        if ref not in allowed:
            leaks.append(_describe_ref(ref) + (" (in packed-refs)" if ref in packed_refs else ""))
    remotes = git(["remote"], cwd=root).split()
    leaks += [f"remote {r!r} configured" for r in remotes]
    logs = git_dir / "logs"
    if logs.is_dir():
        for f in sorted(logs.rglob("*")):
            if f.is_file() and f.stat().st_size:
                n = len(f.read_bytes().splitlines())
                leaks.append(f"reflog {f.relative_to(git_dir).as_posix()} ({n} entries)")
    head = git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], cwd=root, check=False).strip()
    if not head:
        leaks.append("HEAD names no commit")
    commits = git(["rev-list", "--all", "--parents"], cwd=root).splitlines() if head else []
    if len(commits) > 1:
        leaks.append(f"{len(commits)} commits reachable (expected 1)")
    elif commits and len(commits[0].split()) > 1:
        leaks.append(f"commit {head[:12]} has parents")
    if head:
        reachable = {line.split()[0] for line in
                     git(["rev-list", "--objects", "HEAD"], cwd=root).splitlines() if line}
        stored = {}
        for line in git(["cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)"],
                        cwd=root).splitlines():
            oid, kind = line.split()
            stored[oid] = kind
        extra = sorted(set(stored) - reachable)
        if extra:
            kinds = sorted({stored[o] for o in extra})
            leaks.append(f"{len(extra)} objects not from the commit ({', '.join(kinds)}; "
                         f"e.g. {stored[extra[0]]} {extra[0][:12]})")
    if leaks:
        raise HistoryLeak(f"{root}: git history leaks: " + "; ".join(leaks), leaks)
    return head
