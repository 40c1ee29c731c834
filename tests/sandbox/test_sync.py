from tryloop.sandbox.sync import SyncRuntime


def test_sync_wrapper_runs_resets_and_closes(runtime_config):
    rt = SyncRuntime(runtime_config)
    with rt.create(rt.workspace_snapshot({"a.txt": "one"})) as sb:
        assert sb.exec(["cat", "a.txt"]).stdout == b"one"
        sb.write_file("a.txt", "two")
        assert sb.exec("cat a.txt").stdout == b"two"
        sb.reset()
        assert sb.read_file("a.txt") == b"one"
    assert rt.runtime.live == []
