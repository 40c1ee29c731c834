"""The host-side file API of a real sandbox, and tree upload / download through tar."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from tryloop.errors import PathOutsideSandbox, SandboxError

AGENT = 1000


async def test_write_read_roundtrip(sandbox):
    sandbox.write_file("/workspace/hello.txt", "hello\n")
    assert sandbox.read_file("/workspace/hello.txt") == b"hello\n"
    data = bytes(range(256)) * 4096  # 1 MiB of binary
    sandbox.write_file("/workspace/blob.bin", data)
    assert sandbox.read_file("/workspace/blob.bin") == data
    assert sandbox.read_file("/workspace/blob.bin", max_bytes=10) == data[:10]
    # Commands inside see the same bytes.
    res = await sandbox.exec("cat hello.txt; wc -c < blob.bin")
    assert res.text() == f"hello\n{len(data)}\n"


async def test_overwrite_truncates(sandbox):
    sandbox.write_file("f.txt", "a long first version\n")
    sandbox.write_file("f.txt", "short")
    assert sandbox.read_file("f.txt") == b"short"


async def test_files_written_by_the_agent_are_readable(sandbox):
    res = await sandbox.exec("printf 'from inside' > inside.txt; mkdir -p d/e; echo x > d/e/f")
    assert res.ok
    assert sandbox.read_file("inside.txt") == b"from inside"
    assert sandbox.read_file("/workspace/d/e/f") == b"x\n"


async def test_write_creates_parent_dirs_owned_by_agent(sandbox):
    sandbox.write_file("a/b/c/file.txt", "deep")
    for d in ("a", "a/b", "a/b/c"):
        info = sandbox.stat(d)
        assert info.type == "dir"
        assert info.uid == AGENT, d
    info = sandbox.stat("a/b/c/file.txt")
    assert info.type == "file"
    assert info.uid == AGENT
    assert info.size == 4
    res = await sandbox.exec("stat -c '%u:%g %n' a a/b a/b/c a/b/c/file.txt")
    assert all(line.startswith(f"{AGENT}:{AGENT} ") for line in res.text().splitlines()), res.text()


async def test_agent_can_edit_and_extend_written_files(sandbox):
    sandbox.write_file("dir/notes.txt", "one\n")
    res = await sandbox.exec("echo two >> dir/notes.txt && touch dir/new && rm dir/new && mv dir/notes.txt dir/n2")
    assert res.ok, res.text("stderr")
    assert sandbox.read_file("dir/n2") == b"one\ntwo\n"
    assert not sandbox.files.exists("dir/notes.txt")


async def test_write_mode_is_applied(sandbox):
    sandbox.write_file("run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert sandbox.stat("run.sh").mode == 0o755
    res = await sandbox.exec(["./run.sh"])
    assert res.text() == "ran\n"
    sandbox.write_file("secret", "s", mode=0o600)
    assert sandbox.stat("secret").mode == 0o600


async def test_list_dir_stat_exists(sandbox):
    await sandbox.exec("mkdir sub && echo 12345 > sub/five && ln -s five sub/link && mkdir sub/inner")
    entries = {e.name: e for e in sandbox.list_dir("sub")}
    assert set(entries) == {"five", "link", "inner"}
    assert entries["five"].type == "file" and entries["five"].size == 6
    assert entries["link"].type == "symlink"
    assert entries["inner"].type == "dir"
    assert entries["five"].path == "/workspace/sub/five"
    assert [e.name for e in sandbox.list_dir("sub")] == sorted(entries)  # sorted by name
    st = sandbox.stat("/workspace/sub/link")
    assert st.type == "symlink"  # not followed
    assert sandbox.files.exists("sub/five")
    assert sandbox.files.exists("sub")
    assert not sandbox.files.exists("sub/nope")
    assert sandbox.stat("/").type == "dir"
    assert {e.name for e in sandbox.list_dir("/")} >= {"workspace", "usr", "tmp", "proc", "etc"}


async def test_relative_paths_are_relative_to_workspace(sandbox):
    sandbox.write_file("rel.txt", "r")
    assert sandbox.read_file("/workspace/rel.txt") == b"r"
    assert (await sandbox.exec("cat /workspace/rel.txt")).text() == "r"
    assert sandbox.stat("rel.txt").path == "/workspace/rel.txt"
    assert {e.name for e in sandbox.list_dir()} == {"rel.txt"}
    assert {e.name for e in sandbox.list_dir(".")} == {"rel.txt"}


async def test_reading_a_missing_file_raises_file_not_found(sandbox):
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("missing.txt")
    with pytest.raises(FileNotFoundError):
        sandbox.stat("/workspace/missing/deeper")
    with pytest.raises(FileNotFoundError):
        sandbox.list_dir("no-dir")


async def test_reading_a_directory_is_refused(sandbox):
    with pytest.raises((PathOutsideSandbox, IsADirectoryError)):
        sandbox.read_file("/workspace")


async def test_writing_into_read_only_usr_is_refused(sandbox):
    with pytest.raises((PathOutsideSandbox, OSError)):
        sandbox.write_file("/usr/evil.txt", "x")
    with pytest.raises((PathOutsideSandbox, OSError)):
        sandbox.write_file("/usr/bin/newdir/evil.txt", "x")
    assert not os.path.exists("/usr/evil.txt")
    assert not os.path.exists("/usr/bin/newdir")
    assert not sandbox.files.exists("/usr/evil.txt")


async def test_writing_into_proc_is_refused(sandbox):
    with pytest.raises((PathOutsideSandbox, OSError)):
        sandbox.write_file("/proc/sys/kernel/hostname", "pwned")


async def test_files_in_image_are_readable_but_agent_cannot_write_usr(sandbox):
    assert b"agent:x:1000" in sandbox.read_file("/etc/passwd")
    res = await sandbox.exec("touch /usr/x")
    assert not res.ok


async def test_write_file_visible_in_host_upper_dir_only(sandbox):
    sandbox.write_file("layered.txt", "up")
    assert (sandbox.upper_dir() / "workspace" / "layered.txt").read_bytes() == b"up"
    assert (sandbox.root_dir() / "workspace" / "layered.txt").read_bytes() == b"up"


def _make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "README.md": b"# project\n",
        "pkg/__init__.py": b"",
        "pkg/mod.py": b"def f():\n    return 42\n",
        "pkg/data/blob.bin": os.urandom(100_000),
        "empty/.keep": b"",
        "with space/file name.txt": b"spaces",
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / "pkg" / "run.sh").write_bytes(b"#!/bin/sh\necho tree-script\n")
    (root / "pkg" / "run.sh").chmod(0o755)
    files["pkg/run.sh"] = b"#!/bin/sh\necho tree-script\n"
    return files


def _files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def test_upload_directory_and_download_roundtrip(sandbox, tmp_path):
    src = tmp_path / "src"
    files = _make_tree(src)
    await sandbox.upload(src, "/workspace/x")
    for rel, data in files.items():
        assert sandbox.read_file(f"x/{rel}") == data, rel
    # Uploaded files belong to the agent, and executables stay executable.
    assert sandbox.stat("x/pkg/mod.py").uid == AGENT
    assert (await sandbox.exec(["x/pkg/run.sh"])).text() == "tree-script\n"
    res = await sandbox.exec(["python3", "-B", "-c", "import sys; sys.path.insert(0, 'x'); import pkg.mod; print(pkg.mod.f())"])
    assert res.text() == "42\n"

    await sandbox.exec("echo added > x/pkg/added.txt && rm x/README.md")
    data = await sandbox.download("/workspace/x")
    out = tmp_path / "out"
    out.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(out, filter="data")
    expected = dict(files)
    del expected["README.md"]
    expected["pkg/added.txt"] = b"added\n"
    assert _files_of(out) == expected
    assert os.access(out / "pkg" / "run.sh", os.X_OK)


async def test_upload_relative_dest_and_default(sandbox, tmp_path):
    (tmp_path / "a.txt").write_text("A")
    await sandbox.upload(tmp_path)
    assert sandbox.read_file("a.txt") == b"A"
    await sandbox.upload(tmp_path, "nested/dir")
    assert sandbox.read_file("/workspace/nested/dir/a.txt") == b"A"


async def test_upload_tar_bytes(sandbox):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in {"t/one.txt": b"1", "t/sub/two.txt": b"22"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.uid = 0  # --no-same-owner: ends up as the agent's anyway
            tar.addfile(info, io.BytesIO(data))
    await sandbox.upload(buf.getvalue(), "/workspace/fromtar")
    assert sandbox.read_file("fromtar/t/one.txt") == b"1"
    assert sandbox.read_file("fromtar/t/sub/two.txt") == b"22"
    assert sandbox.stat("fromtar/t/sub/two.txt").uid == AGENT


async def test_upload_of_garbage_raises(sandbox):
    with pytest.raises(SandboxError):
        await sandbox.upload(b"this is not a tar archive" * 100, "/workspace/bad")


async def test_upload_where_agent_cannot_write_raises(sandbox, tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SandboxError):
        await sandbox.upload(tmp_path, "/usr/share/tryloop-upload")


async def test_download_missing_dir_raises(sandbox):
    with pytest.raises(SandboxError):
        await sandbox.download("/workspace/nope")


async def test_download_over_limit_raises(sandbox):
    await sandbox.exec("head -c 200000 /dev/urandom > big.bin")
    with pytest.raises(SandboxError, match="larger than limit"):
        await sandbox.download("/workspace", limit_bytes=10_000)
