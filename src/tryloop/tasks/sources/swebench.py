"""SWE-bench-style instances as repository-level tasks.

An instance is a dict with `instance_id`, `repo` ("owner/name"), `base_commit`,
`problem_statement`, `patch` (the gold fix, a unified diff), `test_patch` (a
unified diff adding or changing tests), `FAIL_TO_PASS` and `PASS_TO_PASS`
(lists of test ids, or JSON strings of lists, as SWE-bench ships them).
`repo_dir` is a local checkout of the repository (there is no network): when it
is a git repository and the instance names a `base_commit`, the base state is
that commit (cloned, so `repo_dir` is never modified); otherwise `repo_dir` is
taken as the base state as it is.

The task:

    workspace   the base state exactly (test files too, as the base has them)
    tests       every file the test patch adds or changes, with its content after the patch;
                laid over the workspace only to judge
    solution    every file the gold patch adds or changes, with its content after the patch
    instruction the problem statement

Patches are applied with `git apply` to a scratch copy, and which files they
touch is read back from git, so renames, new files and binary patches count.
Deletions cannot be expressed by file overlays: files the test patch deletes
stay in the workspace and files the gold patch deletes stay in the solved
state; both are listed in `origin` (`test_patch_deletes`, `patch_deletes`).

The environment (tryloop.sandbox.build): the repository's dependencies, installed with pip
into an image, built once per repository version and shared by its instances. Which
dependencies (recorded in `origin.environment` at import):

    the instance's `requirements` (or `pip_packages`, as SWE-bench's harness names them):
        a list of requirement strings, or one string of lines
    else what the repository declares, read at the instance's `environment_setup_commit`
        (the commit SWE-bench sets a version's environment up from) or else its base commit:
        requirements.txt and the test requirement files (requirements-test.txt,
        requirements-tests.txt, requirements_test.txt, test-requirements.txt,
        requirements-dev.txt), pyproject.toml's [project] dependencies and its optional
        `test` / `tests` / `testing` / `dev` dependencies, setup.cfg's install_requires and
        the same extras; all of them, in that order, duplicates dropped

Lines that are pip options (`-r`, `-e`, `-c`, `--index-url`...) or local paths are skipped
(listed in `origin.environment.skipped`): the repository itself is not installed, it is the
task's workspace, imported by the tests from the working directory. The key of an
environment is (repo, version): the instance's `version`, or else its base commit. Its
image (`environment_spec`) is the host-derived root with one pip step
installing the dependencies into /opt/tryloop/site, which is on the image's PYTHONPATH;
`build_environment` builds it (the pip step runs in a build sandbox, with the network the
builder gives build steps), names it `swebench/<owner>__<name>:<version>` and records its id
on the task (`meta.image`: part of the task's fingerprint, so of its snapshot ids and reward
versions). Instances of one version declare the same dependencies, so their specs are the
same and the second build is the build cache's: the same image id. The task's sandboxes run
on the image with the host's Python bound in, as a Harbor task's do
(tryloop.tasks.harness.task_snapshot). An instance without dependencies keeps the
host-derived root.

Test ids are taken as pytest node ids (`path::test`), which is what tryloop's
test runner reports. The default test command runs the test files those ids
name (or, failing that, the Python files the test patch touches); pass
`test_command` (or put `test_command` in the instance) for anything else.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tryloop.tasks.model import Task, TaskMeta, _slugify
from tryloop.tasks.project import ignored
from tryloop.tasks.sources.local import GIT_IDENTITY, SourceError, clone_at, git, is_src_layout

REQUIRED = ("instance_id", "repo", "problem_statement", "patch", "test_patch")


def _test_list(value: Any, field: str, instance_id: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError:
            raise SourceError(f"{instance_id}: {field} is neither a list nor a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SourceError(f"{instance_id}: {field} must be a list of test ids")
    return list(value)


def normalize_instance(instance: dict[str, Any]) -> dict[str, Any]:
    """Check the required keys; FAIL_TO_PASS / PASS_TO_PASS become lists."""
    iid = str(instance.get("instance_id", "<no instance_id>"))
    missing = [k for k in REQUIRED if not isinstance(instance.get(k), str)]
    if missing:
        raise SourceError(f"instance {iid}: missing or non-string {', '.join(missing)}")
    out = dict(instance)
    out["FAIL_TO_PASS"] = _test_list(instance.get("FAIL_TO_PASS"), "FAIL_TO_PASS", iid)
    out["PASS_TO_PASS"] = _test_list(instance.get("PASS_TO_PASS"), "PASS_TO_PASS", iid)
    return out


def load_instances(path: str | Path) -> list[dict[str, Any]]:
    """Instances from a JSON file (one object or a list) or a JSONL file (one object a line)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
        items = doc if isinstance(doc, list) else [doc]
    except json.JSONDecodeError:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SourceError(f"{path}:{n}: invalid JSON: {e}") from None
    if not all(isinstance(i, dict) for i in items):
        raise SourceError(f"{path}: instances must be JSON objects")
    return [normalize_instance(i) for i in items]


def _copy_base(repo_dir: Path, base_commit: str | None, dest: Path) -> str | None:
    """Lay the base state into `dest` (a fresh directory); return the commit used, if any."""
    if (repo_dir / ".git").exists() and base_commit:
        commit = clone_at(repo_dir, base_commit, dest)
        shutil.rmtree(dest / ".git")
        return commit
    shutil.copytree(repo_dir, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    return None


def _changed_by(scratch: Path, patch: str, what: str, instance_id: str) -> tuple[dict[str, bytes], list[str]]:
    """Apply `patch` in the scratch repository; return ({changed path: new bytes}, [deleted paths])
    and put the scratch tree back to its commit."""
    patch_file = scratch / ".git" / "tryloop.patch"
    patch_file.write_text(patch if patch.endswith("\n") else patch + "\n")
    try:
        git(["apply", "--whitespace=nowarn", str(patch_file)], cwd=scratch)
    except SourceError as e:
        raise SourceError(f"{instance_id}: the {what} does not apply to the base state: {e}") from None
    # Staged with --force, so files a .gitignore names count too.
    git(["add", "--all", "--force", "."], cwd=scratch)
    out = git(["diff", "--cached", "--name-status", "--no-renames", "-z", "HEAD"], cwd=scratch)
    fields = [f for f in out.split("\0") if f]
    changed: dict[str, bytes] = {}
    deleted: list[str] = []
    for status, rel in zip(fields[0::2], fields[1::2], strict=True):
        if status.startswith("D"):
            deleted.append(rel)
        else:
            changed[rel] = (scratch / rel).read_bytes()
    git(["reset", "--quiet", "--hard"], cwd=scratch)
    git(["clean", "--quiet", "-f", "-d", "-x"], cwd=scratch)
    return changed, sorted(deleted)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and not ignored(p.relative_to(root).as_posix())}


def default_test_command(base: Path, test_ids: Iterable[str], test_files: Iterable[str]) -> str:
    files = sorted({t.split("::", 1)[0] for t in test_ids if "::" in t})
    if not files:
        files = sorted(f for f in test_files if f.endswith(".py"))
    words = ["python3", "-m", "pytest", "-q"]
    if is_src_layout(base):
        words += ["-o", "pythonpath=src"]
    return shlex.join(words + files)


def task_from_instance(instance: dict[str, Any], repo_dir: str | Path, dest: str | Path, *,
                       test_command: str | None = None, tier: str | None = None) -> Task:
    """Write the instance as a task at `dest` (see the module doc for the layout)."""
    inst = normalize_instance(instance)
    iid = inst["instance_id"]
    repo_dir = Path(repo_dir)
    if not repo_dir.is_dir():
        raise SourceError(f"{iid}: repository directory {repo_dir} does not exist")
    with tempfile.TemporaryDirectory(prefix="swebench-") as tmp:
        base = Path(tmp) / "base"
        commit = _copy_base(repo_dir, inst.get("base_commit"), base)
        workspace = _files(base)
        # A scratch repository of the base state, to apply the patches to and read back from.
        git(["init", "--quiet", "--template=", "--initial-branch=base"], cwd=base)
        git(["add", "--all", "--force", "."], cwd=base)
        git(["commit", "--quiet", "--no-verify", "--no-gpg-sign", "--allow-empty", "-m", "base"], cwd=base,
            env=GIT_IDENTITY)
        tests, test_deletes = _changed_by(base, inst["test_patch"], "test patch", iid)
        solution, patch_deletes = _changed_by(base, inst["patch"], "gold patch", iid)
        shutil.rmtree(base / ".git")
        f2p, p2p = inst["FAIL_TO_PASS"], inst["PASS_TO_PASS"]
        command = test_command or inst.get("test_command") or default_test_command(base, [*f2p, *p2p], tests)
    if not solution:
        raise SourceError(f"{iid}: the gold patch changes no file")
    slug = _slugify(iid)
    origin: dict[str, Any] = {"instance_id": iid, "repo": inst["repo"],
                              "base_commit": commit or inst.get("base_commit") or "",
                              "test_patch_files": sorted(tests), "patch_files": sorted(solution)}
    for key in ("version", "environment_setup_commit", "created_at"):
        if inst.get(key):
            origin[key] = inst[key]
    origin["environment"] = environment_requirements(inst, repo_dir, commit or inst.get("base_commit"))
    if test_deletes:
        origin["test_patch_deletes"] = test_deletes
    if patch_deletes:
        origin["patch_deletes"] = patch_deletes
    first_line = next((ln.strip() for ln in inst["problem_statement"].splitlines() if ln.strip()), iid)
    meta = TaskMeta(id=f"swebench/{slug}", family=slug, project=_slugify(inst["repo"].replace("/", "__")),
                    source="swebench", description=first_line[:200], tier=tier,
                    tags=["swebench", "repo-level"], test_command=command, fail_to_pass=f2p,
                    pass_to_pass=p2p, origin=origin)
    return Task.create(dest, meta, inst["problem_statement"], workspace=workspace, tests=tests,
                       solution=solution)


# ---- the environment ---------------------------------------------------------------------------

REQUIREMENT_FILES = ("requirements.txt", "requirements-test.txt", "requirements-tests.txt", "requirements_test.txt",
                     "test-requirements.txt", "requirements-dev.txt")
TEST_EXTRAS = ("test", "tests", "testing", "dev")
WHEELS = "/opt/wheels"


def _read_at(repo_dir: Path, commit: str | None, rel: str) -> str | None:
    """The text of `rel` in `repo_dir` at `commit` (as it is on disk without git or commit)."""
    if commit and (repo_dir / ".git").exists():
        try:
            return git(["show", f"{commit}:{rel}"], cwd=repo_dir)
        except SourceError:
            return None
    p = repo_dir / rel
    return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None


def _lines(text: str) -> list[str]:
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def declared_requirements(repo_dir: Path, commit: str | None) -> tuple[list[str], list[str]]:
    """(requirement lines, files they came from) as the repository declares them at `commit`."""
    import configparser
    import tomllib

    reqs: list[str] = []
    found: list[str] = []
    for name in REQUIREMENT_FILES:
        if (text := _read_at(repo_dir, commit, name)) is not None:
            reqs += _lines(text)
            found.append(name)
    if (text := _read_at(repo_dir, commit, "pyproject.toml")) is not None:
        try:
            project = tomllib.loads(text).get("project", {})
        except tomllib.TOMLDecodeError:
            project = {}
        deps = [d for d in project.get("dependencies", []) if isinstance(d, str)]
        extras = project.get("optional-dependencies", {})
        deps += [d for e in TEST_EXTRAS for d in extras.get(e, []) if isinstance(d, str)]
        if deps:
            reqs += deps
            found.append("pyproject.toml")
    if (text := _read_at(repo_dir, commit, "setup.cfg")) is not None:
        cfg = configparser.ConfigParser(interpolation=None)
        try:
            cfg.read_string(text)
        except configparser.Error:
            cfg = configparser.ConfigParser()
        deps = _lines(cfg.get("options", "install_requires", fallback=""))
        for e in TEST_EXTRAS:
            deps += _lines(cfg.get("options.extras_require", e, fallback=""))
        if deps:
            reqs += deps
            found.append("setup.cfg")
    return reqs, found


def installable(lines: list[str]) -> tuple[list[str], list[str]]:
    """(requirements pip takes from an index, lines skipped): options, local paths and bare URLs
    are skipped (a `name @ URL` direct reference is kept); duplicates dropped, order kept."""
    reqs: list[str] = []
    skipped: list[str] = []
    for line in lines:
        if line.startswith(("-", ".", "/", "~")) or "file:" in line or "://" in line.split("@", 1)[0]:
            skipped.append(line)
        elif line not in reqs:
            reqs.append(line)
    return reqs, skipped


def environment_requirements(inst: dict[str, Any], repo_dir: Path, base_commit: str | None) -> dict[str, Any]:
    """What `origin.environment` records: the key, the requirements, where they came from and
    the lines skipped (see the module doc)."""
    given = inst.get("requirements", inst.get("pip_packages"))
    if given is not None:
        lines = _lines(given) if isinstance(given, str) else [str(x).strip() for x in given if str(x).strip()]
        source: dict[str, Any] = {"from": ["instance"]}
    else:
        commit = inst.get("environment_setup_commit") or base_commit
        lines, found = declared_requirements(repo_dir, commit)
        source = {"from": found, "commit": commit or ""}
    reqs, skipped = installable(lines)
    version = str(inst.get("version") or "") or (base_commit or "")[:12] or "base"
    out = {"repo": inst["repo"], "version": version, "requirements": reqs, **source}
    if skipped:
        out["skipped"] = skipped
    return out


def environment_tag(task: Task) -> str:
    env = task.meta.origin["environment"]
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", env["version"]).lstrip("._-") or "base"
    return f"swebench/{_slugify(env['repo'].replace('/', '__'))}:{clean}"


def needs_image(task: Task) -> bool:
    """Whether an imported SWE-bench-style task has dependencies to install (an image of
    its own); one without keeps the host-derived root."""
    env = task.meta.origin.get("environment") if task.meta.source == "swebench" else None
    return bool(isinstance(env, dict) and env.get("requirements"))


def environment_spec(task: Task, *, find_links: str | Path | None = None):
    """The image spec of the task's environment: the host-derived root and one pip step
    installing the dependencies into /opt/tryloop/site, with the host's Python (the
    interpreter the tests run with, so the wheels pip picks match it). `find_links`: a local
    directory of wheels and sdists, laid into the image at /opt/wheels and installed from
    with `--no-index` (offline)."""
    from tryloop.sandbox.build import ImageSpec, Step

    reqs = task.meta.origin["environment"]["requirements"]
    steps = []
    pip: list[str] = []
    if find_links is not None:
        steps.append(Step(files={WHEELS: str(Path(find_links).resolve())}))
        pip = ["--no-index", "--find-links", WHEELS]
    steps.append(Step(pip=[*pip, *reqs]))
    return ImageSpec(base="host", steps=steps)


async def build_environment(runtime, task: Task, *, find_links: str | Path | None = None,
                            on_step=None) -> str | None:
    """Build the environment image of an imported SWE-bench-style task (`environment_spec`),
    name it `swebench/<owner>__<name>:<version>`, record its id on the task (`meta.image`,
    part of its fingerprint) and return it; None, and nothing changed, for a task without
    dependencies. A failing installation raises BuildError naming the task and the step."""
    from tryloop.errors import SandboxError
    from tryloop.sandbox.build import build_image
    from tryloop.sandbox.catalog import tag_image
    from tryloop.sandbox.dockerfile import BuildError

    if not needs_image(task):
        return None
    spec = environment_spec(task, find_links=find_links)
    try:
        image = await build_image(runtime, spec, on_step=on_step and (
            lambda i, n, what, hit: on_step(f"{i}/{n} {what} ({'cached' if hit else 'built'})")))
    except SandboxError as e:
        raise BuildError(f"{task.id}: the environment {environment_tag(task)} did not build: {e}") from None
    tag_image(runtime.store, environment_tag(task), image.id)
    origin = dict(task.meta.origin)
    origin["environment"] = {**origin["environment"], "image": image.id, "tag": environment_tag(task)}
    task.save_meta(task.meta.model_copy(update={"image": image.id, "origin": origin}))
    return image.id
