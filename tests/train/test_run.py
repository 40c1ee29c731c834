"""The RL loop for real: the bundled model, HumanEval tasks gated into a store, rollouts in
sandboxes, the verifier, optimizer steps, checkpoints — and a resume after SIGKILL."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import signal
import subprocess
import sys
import textwrap
import urllib.request
from collections import deque
from pathlib import Path

import pytest
import torch
import yaml

from host import CGROUP_PARENT
from tryloop.config import load_yaml
from tryloop.rewards.gold import GateBlocked, GateRecords, builtin_items, run_gate
from tryloop.rewards.spec import RewardSpec
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.factory import build_humaneval
from tryloop.tasks.gate import GateConfig
from tryloop.tasks.store import TaskStore
from tryloop.train import checkpoint
from tryloop.train.curriculum import Curriculum

# Length-aware shaping gives every group a spread of rewards, so a short run always updates.
SPEC = {"components": [{"name": "correctness", "kind": "tests", "weight": 1.0},
                       {"name": "compiles", "kind": "compiles", "weight": 0.1},
                       {"name": "brevity", "kind": "tokens", "weight": 0.1, "budget": 160}]}


# Episodes cut short where a test needs the loop's shape, not answers worth their length: the
# model writes about 10 tokens/s per sequence on 2 cores.
SHORT = {"max_turns": 1, "max_new_tokens": 64, "max_total_tokens": 64, "max_context_tokens": 1024}


def write_config(root: Path, name: str = "config.yaml", **train) -> Path:
    doc = {
        "runtime": {"store_dir": str(root / "rt"), "state_dir": str(root / "state"), "cgroup_name": CGROUP_PARENT},
        "tasks": {"store_url": str(root / "tasks"), "work_dir": str(root / "work"), "eval_fraction": 0.3},
        "rewards": {"spec": SPEC, "gate_dir": str(root / "gate"), "gold_path": str(root / "gold.jsonl")},
        "store": {"trajectories_url": str(root / "traj"), "runs_dir": str(root / "runs")},
        "train": {"steps": 2, "tasks_per_step": 1, "group_size": 2, "concurrency": 1, "eval_tasks": 0,
                  "source": "humaneval", "zone": False, "check_source": None, "refill_groups": 0,
                  "eval_at_start": False, "policy": {"temperature": 1.0, "max_batch": 4, "dtype": "float32"},
                  "algo": {"lr": 1e-5, "micro_batch": 2, "temperature": 1.0},
                  "limits": {"max_turns": 1, "max_new_tokens": 160, "max_total_tokens": 160,
                             "max_context_tokens": 1024}, **train},
    }
    path = root / name
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def train_root(tmp_path_factory):
    """A task store with a few gated HumanEval tasks and an approved reward gate."""
    root = tmp_path_factory.mktemp("train")
    cfg = load_yaml(write_config(root))
    rt = SandboxRuntime(cfg.runtime)
    store = TaskStore(cfg.tasks.store_url)
    asyncio.run(build_humaneval(rt, store, root / "work", gate=GateConfig(k=1), eval_fraction=0.3, limit=6))
    task = store.get(store.query(split="train")[0].fingerprint)
    gold = [i for i in builtin_items(task) if i.label in ("reference", "do_nothing")]
    out = asyncio.run(run_gate(rt, {task.fingerprint(): task}, gold, cfg.rewards.spec, GateRecords(cfg.rewards.gate_dir)))
    assert out.approved, out.report()
    return root


def weights_digest(run_dir: Path) -> str:
    import torch

    state = torch.load(checkpoint.latest(run_dir) / "learner.pt", weights_only=False)["model"]
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode() + state[k].float().numpy().tobytes())
    return h.hexdigest()


def learner_steps(run_dir: Path) -> int:
    """The optimizer steps the learner had taken when its latest checkpoint was written."""
    import torch

    return int(torch.load(checkpoint.latest(run_dir) / "learner.pt", weights_only=False)["optimizer_steps"])


def test_curriculum_prefers_the_learning_zone_and_round_trips():
    c = Curriculum(["a", "b", "c", "d"], window=4, explore=0.25, seed=1)
    for fp, results in {"a": [1, 0], "b": [0, 0], "c": [1, 1]}.items():
        for r in results:
            c.record(fp, bool(r))
    learning, unseen, saturated = c.zone()
    assert learning == ["a"] and unseen == ["d"] and sorted(saturated) == ["b", "c"]
    picks = c.sample(2)
    assert picks[0] == "a" and picks[1] == "d"       # the zone first, then the unseen
    state = json.loads(json.dumps(c.state()))
    d = Curriculum(["a", "b", "c", "d"], window=4, explore=0.25, seed=99)
    d.load(state)
    assert [d.sample(3) for _ in range(3)] == [c.sample(3) for _ in range(3)]
    assert isinstance(d.history["a"], deque) and d.history["a"].maxlen == 4


def test_checkpoints_are_atomic_and_pruned(tmp_path):
    for step in range(4):
        checkpoint.save(tmp_path, step, {"model": {"w": step}}, {"curriculum": {}}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert names == ["step-000002", "step-000003"] and checkpoint.latest(tmp_path).name == "step-000003"
    (tmp_path / "checkpoints" / ".step-000004.tmp").mkdir()   # a save killed half-way
    learner, state = checkpoint.load(checkpoint.latest(tmp_path))
    assert learner["model"]["w"] == 3 and state["step"] == 3


@pytest.mark.host   # mounts a tmpfs on the host
def test_a_checkpoint_that_does_not_fit_is_refused_and_the_previous_one_stays(tmp_path):
    """A real small disk (a 4 MiB tmpfs): a save too large by its tensors is refused before a
    byte is written; one whose bulk the estimate cannot see fills the disk and is removed. Both
    name the directory, and the previous checkpoint stays the one to resume from."""
    import torch

    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
    try:
        small = {"model": {"w": torch.zeros(2**18)}}                 # 1 MiB
        for step in range(2):
            checkpoint.save(disk, step, small, {}, keep=2)
        root = disk / "checkpoints"
        with pytest.raises(checkpoint.CheckpointError,
                           match=rf"step-000002 needs about 8 MiB in {root}, which has \d MiB free; step-000001 stays"):
            checkpoint.save(disk, 2, {"model": {"w": torch.zeros(2**21)}}, {}, keep=2)
        with pytest.raises(checkpoint.CheckpointError, match=rf"step-000002 could not be written to {root}"):
            checkpoint.save(disk, 2, {"model": {"w": torch.zeros(4)}, "blob": b"x" * 6 * 2**20}, {}, keep=2)
        # Room was made before writing (step 0 went), nothing half-written is left, step 1 loads.
        assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step-000001"]
        learner, state = checkpoint.load(checkpoint.latest(disk))
        assert state["step"] == 1 and learner["model"]["w"].shape == (2**18,)
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_real_short_run_takes_optimizer_steps(train_root, tmp_path):
    from tryloop.train.run import train

    cfg = load_yaml(write_config(train_root, run_id="short", concurrency=2))   # the group's two at once
    # Its metrics are served while it runs (any free port) and scraped after each step.
    cfg = cfg.model_copy(update={"telemetry": cfg.telemetry.model_copy(update={"metrics_port": 0})})
    url, scraped, logs = [], [], []

    def hook(event, data):
        if event == "log":
            logs.append(data["message"])
        if event == "log" and data["message"].startswith("metrics: "):
            url.append(data["message"].removeprefix("metrics: "))
        if event == "step":
            scraped.append(urllib.request.urlopen(url[0], timeout=10).read().decode())

    res = asyncio.run(train(cfg, cfg.train, hook=hook))
    assert res.steps_done == 2 and len(res.metrics) == 2
    assert len(scraped) == 2 and "tryloop_train_step 1.0" in scraped[-1]
    # The task counts say how many held-out tasks there are, and that train.eval_tasks leaves them out.
    counted = next(m for m in logs if "approved by the gate" in m)
    assert re.match(r"\d+ train / [1-9]\d* held-out tasks \(0 of the held-out evaluated: train.eval_tasks\)",
                    counted), counted
    assert "tryloop_pool_acquire_total{" in scraped[-1] and "tryloop_scheduler_" in scraped[-1]
    with pytest.raises(OSError):     # the server went with the run
        urllib.request.urlopen(url[0], timeout=2)
    m = res.metrics
    assert all(x["episodes"] == 2 for x in m)
    # What the verifier's flag policy did and why episodes were masked, counted per step.
    assert all(sum(x["flag_actions"].values()) <= 2 and sum(x["mask_reasons"].values()) <= 2 for x in m)
    assert any(x.get("learn_optimizer_steps", 0) > 0 for x in m), m
    assert all(x.get("learn_loss") is None or abs(x["learn_loss"]) < 1e3 for x in m)
    from tryloop.store.trajectories import TrajectoryStore

    trajs = TrajectoryStore(cfg.store.trajectories_url).read(run_id="short")
    assert len(trajs) == 4 and all(t.token_source == "exact" and sum(t.loss_mask) > 0 for t in trajs)
    assert {t.policy_version for t in trajs if t.step == 1} == {"step-0"}   # step 1 sampled the new weights
    before = weights_digest(res.run_dir)
    assert res.report_path.exists() and "Training run short" in res.report_path.read_text()
    # The live state the dashboard reads: the scheduler's and pools' registry, marked ended.
    state = json.loads((res.run_dir / "state.json").read_text())
    assert state["live"] is False and state["metrics"]["tryloop_train_step"][0]["value"] == 1.0
    assert "tryloop_pool_acquire_total" in state["metrics"] and "tryloop_scheduler_admission_limit" in state["metrics"]
    # The run refuses to start again without --resume, and refuses a reward version the gate never saw.
    with pytest.raises(Exception, match="--resume"):
        asyncio.run(train(cfg, cfg.train))
    other = cfg.model_copy(update={"rewards": cfg.rewards.model_copy(update={"spec": RewardSpec()})})
    with pytest.raises(GateBlocked):
        asyncio.run(train(other, cfg.train.model_copy(update={"run_id": "other"})))
    assert weights_digest(res.run_dir) == before  # the refused starts left the checkpoint alone
    # With its directory gone, a new run of the same id would read the stored episodes back as its
    # own (they are found by id): it is refused, and the episodes stay.
    from tryloop.errors import TryloopError

    gone = res.run_dir.with_name("short-removed")
    res.run_dir.rename(gone)
    try:
        with pytest.raises(TryloopError, match=r"already holds episodes of a run 'short' \(short\).*--run-id"):
            asyncio.run(train(cfg, cfg.train))
        assert not res.run_dir.exists()
        assert len(TrajectoryStore(cfg.store.trajectories_url).read(run_id="short")) == 4
        # The command refuses it the same way, before it builds anything or draws the run's table.
        cli = subprocess.run([str(Path(sys.executable).parent / "tryloop"), "train", "--config",
                              str(write_config(train_root, "cli.yaml", run_id="short"))],
                             capture_output=True, text=True, timeout=120, env={"COLUMNS": "400", "NO_COLOR": "1",
                                                                               "PATH": "/usr/bin:/bin"})
        assert cli.returncode == TryloopError.exit_code, cli.stdout + cli.stderr
        said = cli.stdout + cli.stderr
        assert "already holds episodes of a run 'short'" in said and "training —" not in said
        assert not res.run_dir.exists()
    finally:
        gone.rename(res.run_dir)


def test_a_run_trains_a_hugging_face_checkpoint_directory(train_root, smollm2, tmp_path):
    """train.policy.name a checkpoint directory of another architecture (a small GPT-2 with the
    bundled tokenizer): the same config runs, samples it with the engine and updates its weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tryloop.train.run import train

    tok = smollm2.tokenizer
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=smollm2.model.config.vocab_size, n_embd=32, n_layer=2, n_head=2,
                                       n_positions=1024, bos_token_id=tok.eos_token_id,
                                       eos_token_id=tok.eos_token_id))
    # A fixed next-token distribution with end-of-sequence at ~10 %: answers of many lengths, so the
    # length shaping gives every group a spread (random weights would never stop before the cap).
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(torch.nn.functional.one_hot(torch.tensor(0), 32).float())
        model.transformer.wte.weight[:, 0] = 0.0
        model.transformer.wte.weight[tok.eos_token_id, 0] = 8.5
    ckpt = tmp_path / "gpt2-tiny"
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    cfg = load_yaml(write_config(train_root, run_id="hf-dir", steps=1, concurrency=2, group_size=4, limits=SHORT,
                                 policy={"name": str(ckpt), "temperature": 1.0, "max_batch": 4, "dtype": "float32"}))
    res = asyncio.run(train(cfg, cfg.train))
    assert res.steps_done == 1 and res.metrics[0]["episodes"] == 4
    assert res.metrics[0].get("learn_optimizer_steps", 0) > 0, res.metrics
    state = torch.load(checkpoint.latest(res.run_dir) / "learner.pt", weights_only=False)["model"]
    before = GPT2LMHeadModel.from_pretrained(ckpt).state_dict()
    assert state["transformer.wte.weight"].shape == before["transformer.wte.weight"].shape
    assert not torch.equal(state["transformer.ln_f.bias"].float(), before["transformer.ln_f.bias"])   # updated


@pytest.mark.slow   # three runs, one of two steps: ~2.5 min on 2 shared cores
def test_a_run_samples_from_a_model_server_and_pushes_each_update_to_it(train_root, tmp_path):
    """train.sampler.endpoints: a real `serve model` (in a thread) samples the episodes; after each
    update the learner's weights go to it over HTTP with their version; the next step's
    trajectories carry that version. A dead endpoint, one serving other weights at the start, and
    one whose weights change behind the trainer's back are clear errors naming the endpoint."""
    import socket

    import torch

    from tryloop.agent.endpoints import SamplerError
    from tryloop.agent.engine import Engine
    from tryloop.agent.hf import load_model
    from tryloop.serve.config import ServeModelConfig
    from tryloop.serve.model import model_server_in_thread
    from tryloop.store.trajectories import TrajectoryStore
    from tryloop.train.run import train

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    cfg = load_yaml(write_config(train_root, "dead.yaml", run_id="remote-dead", sampler={"endpoints": [dead]}))
    with pytest.raises(SamplerError, match=f"{dead}: GET /v1/models failed"):
        asyncio.run(train(cfg, cfg.train))

    served = load_model("smollm2-135m", device="cpu")
    initial, initial_state = served.weights_version, {k: v.clone() for k, v in served.model.state_dict().items()}
    scfg = ServeModelConfig(port=0, access_log=None, weight_updates=True, threads=1)
    with Engine(served.model, served.tokenizer, weights_version=initial, num_threads=1) as engine, \
            model_server_in_thread(engine, scfg) as url:
        cfg = load_yaml(write_config(train_root, "remote.yaml", run_id="remote",
                                     sampler={"endpoints": [url], "weights_dir": str(tmp_path / "w")}))
        logs: list[str] = []
        res = asyncio.run(train(cfg, cfg.train, hook=lambda e, d: logs.append(d["message"]) if e == "log" else None))
        assert res.steps_done == 2 and all(m["time_push_s"] > 0 for m in res.metrics)
        assert f"sampling from 1 tryloop endpoint(s): {url}; each update's weights go through {tmp_path / 'w'}" in logs
        assert [p.name for p in (tmp_path / "w").iterdir()] == ["step-1.safetensors"]   # step-0's removed
        models = httpx_get_json(f"{url}/v1/models")
        assert models["data"][0]["weights_version"] == "step-1" == engine.weights_version
        trajs = TrajectoryStore(cfg.store.trajectories_url).read(run_id="remote")
        assert len(trajs) == 4 and all(t.token_source == "exact" and sum(t.loss_mask) > 0 for t in trajs)
        assert {tuple(t.weights_versions) for t in trajs if t.step == 0} == {(initial,)}
        assert {tuple(t.weights_versions) for t in trajs if t.step == 1} == {("step-0",)}
        assert {t.policy_version for t in trajs if t.step == 1} == {"step-0"}
        # The server got the learner's weights, not just a version: they changed, as the checkpoint's.
        ckpt = torch.load(checkpoint.latest(res.run_dir) / "learner.pt", weights_only=False)["model"]
        name = "model.layers.0.mlp.down_proj.weight"
        assert torch.equal(engine.model.state_dict()[name].float(), ckpt[name].float())

        # A new run starts from the model's own weights: the server still has step-1.
        fresh = load_yaml(write_config(train_root, "remote-b.yaml", run_id="remote-b", sampler={"endpoints": [url]}))
        with pytest.raises(SamplerError, match=f"{url} serves weights 'step-1', but the learner starts from"):
            asyncio.run(train(fresh, fresh.train))

        # Weights changed behind the trainer's back as the rollout starts: refused, not trained on.
        engine.update_weights_blocking(initial_state, version=initial)
        rogue = load_yaml(write_config(train_root, "remote-c.yaml", run_id="remote-c", steps=1,
                                       sampler={"endpoints": [url]}))

        def hook(event, data):
            if event == "rollout":
                engine.update_weights_blocking(engine.model, version="rogue")

        with pytest.raises(SamplerError, match=r"sampled with weights \['rogue'\] but '.*' was announced"):
            asyncio.run(train(rogue, rogue.train, hook=hook))
        assert not (train_root / "runs" / "remote-c" / "metrics.jsonl").exists()
        assert TrajectoryStore(cfg.store.trajectories_url).read(run_id="remote-c") == []


def httpx_get_json(url: str) -> dict:
    import httpx

    return httpx.get(url, timeout=30).json()


DRIVER = textwrap.dedent("""
    import asyncio, os, signal, sys
    from tryloop.config import load_yaml
    from tryloop.train.run import train
    cfg = load_yaml(sys.argv[1])
    kill_after = sys.argv[2]   # a step number, or "eval": the first evaluation episode
    def hook(event, data):
        if (event == "step" and str(data["step"]) == kill_after) or (event == "eval_episode" and kill_after == "eval"):
            os.kill(os.getpid(), signal.SIGKILL)
    asyncio.run(train(cfg, cfg.train, resume="--resume" in sys.argv, hook=hook))
""")


@pytest.mark.slow
def test_resume_after_sigkill_continues_like_an_uninterrupted_run(train_root, tmp_path):
    from tryloop.store.trajectories import TrajectoryStore

    cfg_a = write_config(train_root, "a.yaml", run_id="a", steps=3)
    cfg_b = write_config(train_root, "b.yaml", run_id="b", steps=3)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    py = sys.executable
    subprocess.run([py, str(script), str(cfg_a), "-1"], check=True, timeout=900)
    killed = subprocess.run([py, str(script), str(cfg_b), "1"], timeout=900)
    assert killed.returncode == -signal.SIGKILL
    # The kill came after step 1 was checkpointed, and by then the learner had taken optimizer
    # steps: a resume has an update to continue from (weights equal because nothing changed
    # would prove nothing).
    run_b = train_root / "runs" / "b"
    before_kill = checkpoint.latest(run_b)
    assert before_kill is not None and before_kill.name == "step-000001"
    steps_before_kill = learner_steps(run_b)
    assert steps_before_kill >= 1
    digest_before_kill = weights_digest(run_b)
    subprocess.run([py, str(script), str(cfg_b), "-1", "--resume"], check=True, timeout=900)
    store = TrajectoryStore(str(train_root / "traj"))
    a = {t.episode_id.split(":", 1)[1]: t for t in store.read(run_id="a")}
    b = {t.episode_id.split(":", 1)[1]: t for t in store.read(run_id="b")}
    assert sorted(a) == sorted(b) and len(a) == 6          # nothing lost, nothing twice
    for k in a:
        assert a[k].token_ids == b[k].token_ids, k          # the same continuation, token for token
    assert weights_digest(train_root / "runs" / "a") == weights_digest(train_root / "runs" / "b")
    ma = [json.loads(x) for x in (train_root / "runs" / "a" / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x) for x in (train_root / "runs" / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in mb] == [0, 1, 2]
    assert [m.get("learn_loss") for m in ma] == [m.get("learn_loss") for m in mb]   # None: no group had signal
    # The resumed run started from the checkpoint of step 1: its learner's optimizer steps are
    # those of the checkpoint plus step 2's own, as in the run that was never interrupted.
    assert checkpoint.latest(run_b).name == "step-000002"
    assert sum(m.get("learn_optimizer_steps", 0) for m in mb[:2]) == steps_before_kill
    assert learner_steps(run_b) == steps_before_kill + mb[2].get("learn_optimizer_steps", 0)
    assert learner_steps(run_b) == learner_steps(train_root / "runs" / "a")
    if mb[2].get("learn_optimizer_steps", 0):
        assert weights_digest(run_b) != digest_before_kill   # step 2 updated the resumed weights


@pytest.mark.slow   # two runs in subprocesses, one killed: ~2 min on 2 cores
def test_a_kill_during_the_final_evaluation_resumes_the_evaluation_alone(train_root, tmp_path):
    """The last step is checkpointed before its evaluations (they run with the optimizer state
    freed): killed during them, the run is resumed without redoing the step, and the evaluation
    continues from the episodes it had stored."""
    from tryloop.store.trajectories import TrajectoryStore

    cfg = write_config(train_root, "final.yaml", run_id="final", steps=1, eval_tasks=1, eval_k=2)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    killed = subprocess.run([sys.executable, str(script), str(cfg), "eval"], timeout=900)
    assert killed.returncode == -signal.SIGKILL
    run = train_root / "runs" / "final"
    assert checkpoint.latest(run).name == "step-000000" and not (run / "evals.jsonl").exists()
    store = TrajectoryStore(str(train_root / "traj"))
    metrics, episodes = (run / "metrics.jsonl").read_text(), store.read(run_id="final")
    assert len(store.read(run_id="final-eval-0")) == 1            # stored before the kill
    subprocess.run([sys.executable, str(script), str(cfg), "-1", "--resume"], check=True, timeout=900)
    assert (run / "metrics.jsonl").read_text() == metrics          # the step was not run again
    assert [t.episode_id for t in store.read(run_id="final")] == [t.episode_id for t in episodes]
    evals = [json.loads(x) for x in (run / "evals.jsonl").read_text().splitlines()]
    assert [(r["step"], r["name"], r["episodes"]) for r in evals] == [(0, "held-out", 2)]
    assert len(store.read(run_id="final-eval-0")) == 2             # one more, none twice
    assert checkpoint.latest(run).name == "step-000000"


@pytest.fixture(scope="module")
def fn_root(train_root):
    """The same store and gate, plus a few synthesized function tasks."""
    from tryloop.tasks.factory import build_functions

    cfg = load_yaml(write_config(train_root))
    asyncio.run(build_functions(SandboxRuntime(cfg.runtime), TaskStore(cfg.tasks.store_url), train_root / "work",
                                gate=GateConfig(k=1), eval_fraction=0.5, per_family=1,
                                families=["add-constant", "upper-case", "sum-list", "max-of-two"]))
    return train_root


def test_a_run_on_its_learning_zone_measures_it_first_and_evaluates_the_check_set(fn_root):
    from tryloop.train.run import train

    path = write_config(fn_root, run_id="zone", source="functions", zone=True, zone_k=1, zone_lo=0.0,
                        zone_hi=1.0, steps=1, eval_tasks=1, eval_at_start=True, eval_k=1,
                        check_source="humaneval", check_tasks=1, concurrency=4, limits=SHORT)
    cfg = load_yaml(path)
    events: list[str] = []
    starts: list[dict] = []

    def hook(event: str, data: dict) -> None:
        events.append(event)
        if event.endswith("_start"):
            starts.append({"event": event, **data})

    res = asyncio.run(train(cfg, cfg.train, hook=hook))
    assert events.index("zone_done") < events.index("rollout")
    zone = json.loads((res.run_dir / "zone.json").read_text())
    assert zone["train"] >= 1 and sum(r["measured"] for r in zone["rows"]) == 4
    # Progress totals: the episodes each measurement and evaluation runs (4 tasks, k=1).
    assert starts[0] == {"event": "zone_start", "episodes": 4, "stored": 0}
    assert [(s["event"], s["step"], s["name"]) for s in starts[1:]] == [
        ("eval_start", -1, "held-out"), ("eval_start", -1, "humaneval"), ("eval_start", 0, "held-out"),
        ("eval_start", 0, "humaneval")]
    assert [s["episodes"] for s in starts[1:]] == [e["episodes"] for e in res.evals]
    assert {r["group"] for r in zone["rows"]} <= {"tier 1", "tier 2", "tier 3"}
    names = [(e["step"], e["name"]) for e in res.evals]
    assert names == [(-1, "held-out"), (-1, "humaneval"), (0, "held-out"), (0, "humaneval")]
    assert all(sum(n for _, n in e["tasks"].values()) == e["episodes"] for e in res.evals)
    m = res.metrics[0]
    assert {"groups_mixed", "refills", "reward_lo", "pass_lo", "time_step_s", "peak_rss_mb"} <= set(m)
    # A second run of the same weights reuses the measurement: no zone episode runs again, though it
    # trains at another temperature, as its zone's temperature is pinned to the first run's.
    from tryloop.train.run_config import TrainRunConfig

    colder = TrainRunConfig.model_validate({
        **cfg.train.model_dump(), "run_id": "zone2", "eval_at_start": False, "check_source": None,
        "policy": {**cfg.train.policy.model_dump(), "temperature": 0.5},
        "algo": {**cfg.train.algo.model_dump(), "temperature": 0.5, "old_logprobs": "recompute"},
        "zone_temperature": cfg.train.policy.temperature})
    assert cfg.train.policy.temperature != 0.5
    again: list[tuple[str, dict]] = []
    asyncio.run(train(cfg, colder, hook=lambda e, d: again.append((e, d))))
    assert [d["key"] for e, d in again if e == "zone"] == [zone["key"]]
    assert "zone_episode" not in [e for e, _ in again] and "zone_start" not in [e for e, _ in again]
    # `tryloop tasks zone` keys its measurement as the run does: it reads the run's, per family.
    from typer.testing import CliRunner

    from tryloop.cli.main import app

    out = CliRunner().invoke(app, ["tasks", "zone", "--by", "family", "--json", "-c", str(path)])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["key"] == zone["key"] and doc["seconds"] < 30
    assert sum(r["measured"] for r in doc["rows"]) == 4
    assert {r["group"].split(" / ")[0] for r in doc["rows"]} == {
        f"functions-{f}" for f in ("add-constant", "upper-case", "sum-list", "max-of-two")}


def test_no_task_in_the_zone_is_a_clear_error(fn_root):
    from tryloop.errors import TryloopError
    from tryloop.train.run import train

    # With one sample per task a pass rate is 0 or 1: a band around 0.5 holds nothing.
    cfg = load_yaml(write_config(fn_root, run_id="nozone", source="functions", zone=True, zone_k=1, zone_lo=0.4,
                                 zone_hi=0.6, check_source=None, limits=SHORT))
    with pytest.raises(TryloopError, match="no task is in the learning zone") as e:
        asyncio.run(train(cfg, cfg.train))
    n_train = len(TaskStore(cfg.tasks.store_url).query(split="train", source="functions"))
    assert f"measured {n_train} of {n_train} tasks" in str(e.value) and "train.zone_k" in str(e.value)
