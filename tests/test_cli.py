"""The `tryloop` command, run as a real subprocess against the test session's private store."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tryloop.sandbox.layers import Snapshot

TRYLOOP = Path(sys.executable).parent / "tryloop"


def tryloop(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([str(TRYLOOP), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def config_file(runtime_config, tmp_path_factory) -> Path:
    """A YAML that points the CLI at this session's store, state dir and cgroup parent."""
    path = tmp_path_factory.mktemp("cli") / "tryloop.yaml"
    path.write_text(yaml.safe_dump({
        "runtime": {"store_dir": str(runtime_config.store_dir), "state_dir": str(runtime_config.state_dir),
                    "cgroup_name": runtime_config.cgroup_name},
        "sandbox": {"limits": {"memory_mb": 256, "pids": 64}},
    }))
    return path


def test_entry_point_exists():
    assert TRYLOOP.exists(), f"{TRYLOOP} missing: is the package installed in the venv?"
    res = tryloop("--help")
    assert res.returncode == 0
    assert "sandbox" in res.stdout


def test_version_and_the_config_from_the_environment(config_file, tmp_path):
    from importlib.metadata import version

    res = tryloop("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"tryloop {version('tryloop')}"
    env = {**os.environ, "TRYLOOP_CONFIG": str(config_file), "COLUMNS": "400", "NO_COLOR": "1"}
    shown = subprocess.run([str(TRYLOOP), "config"], capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0 and "memory_mb: 256" in shown.stdout   # the file's value, not the default
    env["TRYLOOP_CONFIG"] = str(tmp_path / "missing.yaml")
    missing = subprocess.run([str(TRYLOOP), "config"], capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 78 and "missing.yaml" in missing.stderr and "Traceback" not in missing.stderr
    # --debug shows where it came from
    debug = subprocess.run([str(TRYLOOP), "--debug", "config"], capture_output=True, text=True, env=env, timeout=60)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "ConfigError" in debug.stderr



def test_doctor(config_file):
    res = tryloop("sandbox", "doctor", "--config", str(config_file))
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    assert "seccomp" in out
    assert "all required isolation features are available" in out
    assert "live probe" in out


def test_doctor_without_live_probe(config_file):
    res = tryloop("sandbox", "doctor", "--no-live", "--config", str(config_file))
    assert res.returncode == 0, res.stderr
    assert "seccomp" in res.stdout + res.stderr
    assert "live probe" not in res.stdout + res.stderr


def test_run_echo(config_file):
    res = tryloop("sandbox", "run", "--config", str(config_file), "--", "echo", "hi")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "hi\n"
    assert "exit 0" in res.stderr


def test_run_passes_exit_code_and_stderr(config_file):
    res = tryloop("sandbox", "run", "--config", str(config_file), "--", "sh", "-c", "echo oops >&2; exit 3")
    assert res.returncode == 3
    assert "oops" in res.stderr
    assert res.stdout == ""


def test_run_shell_string(config_file):
    res = tryloop("sandbox", "run", "--shell", "--config", str(config_file), "--", "echo $HOME; id -u")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "/home/agent\n1000\n"


def test_run_with_workspace(config_file, project_dir):
    res = tryloop("sandbox", "run", "--config", str(config_file), "-w", str(project_dir), "--",
                  "python3", "-m", "pytest", "-q", "-p", "no:cacheprovider")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "passed" in res.stdout


def test_run_timeout_exits_non_zero(config_file):
    res = tryloop("sandbox", "run", "--timeout", "0.5", "--config", str(config_file), "--", "sleep", "5")
    assert res.returncode != 0
    assert res.returncode == 128 + 9
    assert "timed out" in res.stderr


def test_run_no_network_by_default(config_file):
    res = tryloop("sandbox", "run", "--shell", "--config", str(config_file), "--",
                  "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["lo"]


def test_run_memory_flag_is_a_config_field(config_file):
    res = tryloop("sandbox", "run", "--memory-mb", "5", "--config", str(config_file), "--", "true")
    assert res.returncode == 78   # EX_CONFIG: a configuration error
    assert "sandbox.limits.memory_mb" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("bad, field", [
    ({"sandbox": {"limitz": {"memory_mb": 64}}}, "sandbox.limitz"),
    ({"sandbox": {"limits": {"memory_mb": -5}}}, "sandbox.limits.memory_mb"),
    ({"runtime": {"cgroup_name": "no/slashes"}}, "runtime.cgroup_name"),
    ({"pool": {"size": "many"}}, "pool.size"),
])
def test_bad_config_names_field_and_file(tmp_path, bad, field):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    res = tryloop("sandbox", "run", "--config", str(path), "--", "true")
    assert res.returncode == 78   # EX_CONFIG: a configuration error
    assert field in res.stderr
    assert str(path) in res.stderr
    assert "Traceback" not in res.stderr


def test_invalid_yaml_is_reported(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("sandbox: [unclosed\n")
    res = tryloop("sandbox", "gc", "--config", str(path))
    assert res.returncode == 78   # EX_CONFIG: a configuration error
    assert str(path) in res.stderr
    assert "not valid YAML" in res.stderr
    assert "Traceback" not in res.stderr


def test_missing_config_file(tmp_path):
    path = tmp_path / "nope.yaml"
    res = tryloop("sandbox", "run", "--config", str(path), "--", "true")
    assert res.returncode == 78   # EX_CONFIG: a configuration error
    assert "config file not found" in res.stderr
    assert str(path) in res.stderr
    assert "Traceback" not in res.stderr


def test_gc_runs(config_file):
    res = tryloop("sandbox", "gc", "--config", str(config_file))
    assert res.returncode == 0, res.stderr
    assert "gc:" in res.stderr
    assert "record(s)" in res.stderr


def test_build_then_cached_then_usable(config_file, runtime, tmp_path):
    token = uuid.uuid4().hex
    (tmp_path / "words.txt").write_text(f"alpha\nbeta\n{token}\n")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "a.txt").write_text("tree-a")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "base": "host",
        "env": {"TRYLOOP_IMAGE": "built"},
        "steps": [
            {"files": {"/opt/data/words.txt": "./words.txt", "/opt/tree": "tree"}},
            # Steps run as the image's unprivileged uid, which owns /opt/tryloop.
            {"run": "wc -l < /opt/data/words.txt > /opt/tryloop/count && echo ready > /opt/tryloop/marker"},
        ],
    }))
    first = tryloop("sandbox", "build", str(spec), "--config", str(config_file))
    assert first.returncode == 0, first.stderr
    image_id = first.stdout.strip().splitlines()[-1]
    assert len(image_id) == 64
    assert "step 1/2" in first.stderr and "step 2/2" in first.stderr
    assert "built" in first.stderr
    assert "cached" not in first.stderr

    second = tryloop("sandbox", "build", str(spec), "--config", str(config_file))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == image_id
    assert second.stderr.count("cached") == 2
    assert "built" not in second.stderr.replace(f"image {image_id}", "")

    # Changing a source file rebuilds from that step on.
    (tmp_path / "words.txt").write_text(f"alpha\n{token}\n")
    third = tryloop("sandbox", "build", str(spec), "--config", str(config_file))
    assert third.returncode == 0, third.stderr
    assert third.stdout.strip().splitlines()[-1] != image_id
    assert "cached" not in third.stderr

    import asyncio

    async def check() -> None:
        async with await runtime.create(Snapshot(image_id)) as sb:
            assert sb.read_file("/opt/data/words.txt") == f"alpha\nbeta\n{token}\n".encode()
            assert sb.read_file("/opt/tree/a.txt") == b"tree-a"
            res = await sb.exec("cat /opt/tryloop/marker /opt/tryloop/count; echo $TRYLOOP_IMAGE; id -u")
            assert res.text() == "ready\n3\nbuilt\n1000\n"
            # Writes go to the sandbox's own layer, never into the image.
            assert (await sb.exec("echo x > /opt/tryloop/marker")).ok
        async with await runtime.create(Snapshot(image_id)) as sb:
            assert sb.read_file("/opt/tryloop/marker") == b"ready\n"

    asyncio.run(check())


def test_build_failing_step_reports_error(config_file, tmp_path):
    spec = tmp_path / "fail.yaml"
    spec.write_text(yaml.safe_dump({"steps": [{"run": "echo about-to-fail >&2; exit 4"}]}))
    res = tryloop("sandbox", "build", str(spec), "--config", str(config_file))
    assert res.returncode == 71   # EX_OSERR: a sandbox (build step) failed
    assert "about-to-fail" in res.stderr
    assert "exit 4" in res.stderr
    assert "Traceback" not in res.stderr


def test_build_bad_spec(config_file, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump({"steps": [{"run": "true", "files": {"/a": "b"}}]}))
    res = tryloop("sandbox", "build", str(spec), "--config", str(config_file))
    assert res.returncode == 78   # EX_CONFIG: a configuration error
    assert str(spec) in res.stderr
    assert "steps.0" in res.stderr


def test_build_docstring_example_run_step(runtime, tmp_path):
    import asyncio

    from tryloop.sandbox.build import build_image, load_spec

    spec = tmp_path / "doc.yaml"
    # The example in tryloop.sandbox.build's docstring must work as written.
    spec.write_text('base: host\nsteps:\n  - run: "echo ready > /opt/tryloop/marker"\n')
    image = asyncio.run(build_image(runtime, load_spec(spec)))
    assert image.id


# What pip says when there is no route to an index (the only failure the pip test may skip on).
_NO_INDEX = ("Failed to establish a new connection", "Temporary failure in name resolution",
             "Network is unreachable", "No matching distribution found", "Could not fetch URL",
             "ProxyError", "ConnectTimeoutError")


@pytest.mark.network
def test_image_pip_step_installs_from_the_index_and_is_cached(runtime, tmp_path):
    import asyncio

    from tryloop.errors import SandboxError
    from tryloop.sandbox import Snapshot
    from tryloop.sandbox.build import build_image, load_spec

    spec = tmp_path / "pip.yaml"
    spec.write_text('base: host\nsteps:\n  - pip: ["iso8601==2.1.0"]\n')
    steps: list[bool] = []
    try:
        image = asyncio.run(build_image(runtime, load_spec(spec), on_step=lambda i, n, d, hit: steps.append(hit)))
    except SandboxError as e:
        # Only an index that cannot be reached is a reason to skip; any other failure is a failure.
        if not any(s in str(e) for s in _NO_INDEX):
            raise
        pytest.skip(f"package index unavailable: {str(e)[-300:]}")
    asyncio.run(build_image(runtime, load_spec(spec), on_step=lambda i, n, d, hit: steps.append(hit)))
    assert steps == [False, True]

    async def probe():
        async with await runtime.create(Snapshot(image.id)) as sb:
            return await sb.exec(["python3", "-c", "import iso8601; print(iso8601.__file__)"])

    res = asyncio.run(probe())
    assert res.ok and res.text().startswith("/opt/tryloop/site/"), res.text("stderr")


@pytest.mark.parametrize("policy, expected", [
    ({"device": "cuda:99"}, "train.policy: device 'cuda:99'"),        # no such GPU, CUDA build or not
    ({"device": "gpu"}, "train.policy.device"),
    ({"name": "/nonexistent/checkpoint"}, "no such checkpoint directory"),
    ({"name": "openai"}, "train.policy.name 'openai' is not a model the learner can update"),
    ({"temperature": 0}, "train.policy.temperature is 0"),
])
def test_train_refuses_a_policy_it_cannot_train_before_building_anything(tmp_path, policy, expected):
    # A first run builds its task suite for about two hours before it loads the policy: a wrong
    # device or checkpoint must fail now, naming the field, with nothing built.
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({
        "tasks": {"store_url": str(tmp_path / "tasks"), "work_dir": str(tmp_path / "work")},
        "store": {"trajectories_url": str(tmp_path / "traj"), "runs_dir": str(tmp_path / "runs")},
        "rewards": {"gate_dir": str(tmp_path / "gate")},
        "train": {"policy": policy},
    }))
    res = tryloop("train", "--config", str(path))
    assert res.returncode == 78, res.stdout + res.stderr
    assert expected in res.stderr and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.yaml"]      # nothing built or written


def test_train_refuses_a_checkpoint_it_cannot_load_or_batch(tmp_path):
    from transformers import MistralConfig

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"")
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({"tasks": {"store_url": str(tmp_path / "tasks")},
                                    "train": {"policy": {"name": str(ckpt)}}}))
    res = tryloop("train", "--config", str(path))
    assert res.returncode == 78 and f"{ckpt} has no config.json" in res.stderr, res.stderr
    # A sliding-window model: the in-process engine batches full-attention caches only.
    MistralConfig(sliding_window=64, num_hidden_layers=2, architectures=["MistralForCausalLM"]).save_pretrained(ckpt)
    res = tryloop("train", "--config", str(path))
    assert res.returncode == 78 and "MistralForCausalLM: the engine supports only" in res.stderr, res.stderr
    assert "train.sampler.endpoints" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "tasks").exists()


@pytest.mark.parametrize("args, expected", [
    (["--concurrency", "1,x"], "--concurrency"),
    (["--concurrency", "0"], "--concurrency"),
    (["--dtype", "bf16"], "--dtype"),
    (["--threads", "0"], "--threads"),
    (["--run-dir", "."], "no metrics.jsonl"),
])
def test_bench_generation_refuses_bad_arguments_before_measuring(tmp_path, args, expected):
    res = tryloop("bench", "generation", "--quick", "--out", str(tmp_path / "out.json"), *args)
    assert res.returncode != 0 and expected in res.stdout + res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out.json").exists()
