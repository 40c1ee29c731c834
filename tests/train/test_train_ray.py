"""`tryloop train` on the Ray engine, for real: a local multi-node Ray cluster (Ray's own
`cluster_utils.Cluster`), the bundled model served by the learner's process, episodes in
rollout-worker actors with their own sandboxes, real optimizer steps, weights pushed with a
version after each update."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections import Counter

import pytest
import yaml
from test_run import DRIVER, SHORT, learner_steps, train_root, weights_digest, write_config  # noqa: F401  (train_root: the module-scoped store + gate fixture)

from ray_cluster import local_cluster
from tryloop.config import load_yaml
from tryloop.errors import TryloopError
from tryloop.store.trajectories import TrajectoryStore
from tryloop.train import checkpoint

pytestmark = pytest.mark.ray

RAY = {"engine": "ray", "ray": {"host_resource": "sandbox_host", "episodes_per_host": 2, "reconcile_s": 0.5},
       "admission": {"adaptive": False, "initial": 4, "max": 4},
       "retry": {"backoff_base_s": 0.1, "quarantine_after": 100}}


@pytest.fixture
def cluster():
    with local_cluster(2) as (c, nodes):
        yield c, nodes


# Short answers keep each step to seconds on two shared cores (the episodes are real all the same).


def ray_config(root, name: str, scheduler: dict | None = None, **train):
    cfg = load_yaml(write_config(root, name, **{"concurrency": 2, "limits": SHORT, **train}))
    sched = cfg.scheduler.model_validate({**cfg.scheduler.model_dump(), **RAY, **(scheduler or {})})
    return cfg.model_copy(update={"scheduler": sched})


@pytest.mark.parametrize("tokens", [64, pytest.param(160, marks=pytest.mark.slow)])  # 160: ~2.5 min
def test_two_steps_on_ray_workers_push_versioned_weights_and_checkpoint(cluster, train_root, tmp_path,  # noqa: F811
                                                                         tokens):
    """Two steps; episodes on the Ray nodes' rollout workers, sampling from the model the learner's
    process serves; token-exact trajectories with their weight versions; a checkpoint. With answers
    of up to 160 tokens the groups' rewards differ (64 cut every answer alike), so the learner
    takes real optimizer steps and the next step samples the pushed weights."""
    from tryloop.agent.hf import load_model
    from tryloop.train.run import train
    from tryloop.train.update import Learner

    run_id = f"ray-a-{tokens}"
    cfg = ray_config(train_root, f"{run_id}.yaml", run_id=run_id, sampler={"weights_dir": str(tmp_path / "w")},
                     limits={**SHORT, "max_new_tokens": tokens, "max_total_tokens": tokens})
    logs: list[str] = []
    res = asyncio.run(train(cfg, cfg.train, hook=lambda e, d: logs.append(d["message"]) if e == "log" else None))
    assert res.steps_done == 2 and len(res.metrics) == 2
    assert "episodes run on Ray rollout workers" in logs
    if tokens == 160:
        assert any(m.get("learn_optimizer_steps", 0) > 0 for m in res.metrics)
    assert all(m["time_push_s"] > 0 for m in res.metrics)
    assert checkpoint.latest(res.run_dir).name == "step-000001"
    trajs = TrajectoryStore(cfg.store.trajectories_url).read(run_id=run_id)
    assert len(trajs) == 4 and len({t.episode_id for t in trajs}) == 4
    assert all(t.token_source == "exact" and sum(t.loss_mask) > 0 for t in trajs)
    loaded = load_model("smollm2-135m", device="cpu")
    assert {tuple(t.weights_versions) for t in trajs if t.step == 0} == {(loaded.weights_version,)}
    assert {tuple(t.weights_versions) for t in trajs if t.step == 1} == {("step-0",)}
    # Token-exact: the initial weights give the step-0 tokens the log-probabilities the worker recorded.
    step0 = [t for t in trajs if t.step == 0]
    again = Learner(loaded.model, cfg.train.algo.model_copy(update={"amp": "off"}),
                    tokenizer=loaded.tokenizer).logprobs(step0)
    for t, lp in zip(step0, again, strict=True):
        sampled = [i for i, m in enumerate(t.loss_mask) if m]
        assert max(abs(t.logprobs[i] - lp[i]) for i in sampled) < 1e-3


@pytest.mark.slow   # ~2 min on 2 shared cores: three overlapped steps
def test_overlapped_steps_stay_within_the_staleness_bound_and_are_corrected(cluster, train_root, tmp_path):  # noqa: F811
    """train.overlap: step n+1's rollouts start before step n's update ends; every trajectory
    trained on is at most max_staleness versions behind, and the truncated importance weights are
    applied (their statistics are in the step's metrics)."""
    from tryloop.train.run import train

    cfg = ray_config(train_root, "ray-b.yaml", run_id="ray-b", steps=3, tasks_per_step=2, overlap=True, max_staleness=0,
                     algo={"lr": 1e-5, "micro_batch": 2, "old_logprobs": "recompute"},
                     sampler={"weights_dir": str(tmp_path / "w")})
    events: list[tuple[str, int]] = []
    res = asyncio.run(train(cfg, cfg.train, hook=lambda e, d: events.append((e, d["step"]))
                            if e in ("rollout", "step") else None))
    assert res.steps_done == 3 and cfg.train.algo.tis_cap == 2.0
    # Overlap: the rollout of step 1 began before step 0's update was done (its "step" event).
    assert events.index(("rollout", 1)) < events.index(("step", 0))
    trajs = TrajectoryStore(cfg.store.trajectories_url).read(run_id="ray-b")
    index = {"step-0": 1, "step-1": 2}
    for m in res.metrics:
        assert m["staleness_max"] <= 0
        assert ("learn_tis_weight_mean" in m) == (m["learn_sequences"] > 0)   # the correction, where it trained
        kept = [t for t in trajs if t.step == m["step"]]
        assert len(kept) == 4 == m["episodes"]
        for t in kept:    # max_staleness 0: every token from the weights the step trains from
            assert all(index.get(v, 0) == m["step"] for v in t.weights_versions), (t.step, t.weights_versions)
    assert any(m["learn_sequences"] > 0 for m in res.metrics)
    assert res.metrics[0]["stale_dropped"] == 0     # step 0 starts from the initial weights, nothing older


@pytest.mark.slow   # ~2 min on 2 shared cores
def test_a_rollout_node_lost_mid_step_its_episodes_run_elsewhere_none_lost_none_twice(cluster, train_root):  # noqa: F811
    from tryloop.train.run import train

    c, nodes = cluster
    c.add_node(num_cpus=1, resources={"sandbox_host": 1})   # a third node: two remain after the kill
    c.wait_for_nodes()
    # 6 seats on 3 nodes (2 each), 8 episodes a step: when the first comes back, 5 are in flight and
    # every node runs at least one, so the node removed takes episodes with it.
    cfg = ray_config(train_root, "ray-c.yaml", {"admission": {"adaptive": False, "initial": 6, "max": 6}},
                     run_id="ray-c", tasks_per_step=2, group_size=4, concurrency=6)
    killed: list[str] = []

    def hook(event, data):
        if event == "episode" and data["step"] == 0 and not killed:
            killed.append(nodes[0].node_id)
            c.remove_node(nodes[0])      # a node dies while the step's other episodes run

    res = asyncio.run(train(cfg, cfg.train, hook=hook))
    assert killed and res.steps_done == 2
    trajs = TrajectoryStore(cfg.store.trajectories_url).read(run_id="ray-c")
    ids = Counter(t.episode_id for t in trajs)
    assert len(ids) == 16 and set(ids.values()) == {1}      # none lost, none counted twice
    assert [m["episodes"] for m in res.metrics] == [8, 8]
    # The removed node's episodes failed as WorkerLost and ran again elsewhere.
    state = json.loads((res.run_dir / "state.json").read_text())
    lost = [x for x in state["metrics"]["tryloop_scheduler_failures_total"] if "WorkerLost" in json.dumps(x)]
    assert lost and sum(x["value"] for x in lost) >= 1, state["metrics"]["tryloop_scheduler_failures_total"]


def test_a_worker_with_another_tryloop_stops_the_run(cluster, train_root, monkeypatch):  # noqa: F811
    """A rollout worker whose tryloop differs from the trainer's refuses its episodes; the run stops
    with an error saying so (never trains on what the other nodes sent)."""
    from tryloop.agent.endpoints import SamplerError
    from tryloop.train import remote
    from tryloop.train.run import train

    real = remote.code_identity
    monkeypatch.setattr(remote, "code_identity", lambda: {**real(), "code": "0000000000000000"})
    cfg = ray_config(train_root, "ray-d.yaml", run_id="ray-d", steps=1)
    with pytest.raises(SamplerError, match="WorkerVersionMismatch: this rollout worker runs tryloop"):
        asyncio.run(train(cfg, cfg.train))
    assert TrajectoryStore(cfg.store.trajectories_url).read(run_id="ray-d") == []


@pytest.mark.slow   # ~1.5 min on 2 shared cores
def test_overlap_on_the_local_engine_samples_during_the_update_within_the_bound(train_root):  # noqa: F811
    """train.overlap without Ray: the in-process engine samples the next step while the learner
    updates, and takes the new weights between two decoding steps."""
    from tryloop.train.run import train

    cfg = load_yaml(write_config(train_root, "local-o.yaml", run_id="local-o", steps=3, concurrency=2,
                                 limits=SHORT, overlap=True, max_staleness=1))
    events: list[tuple[str, int]] = []
    res = asyncio.run(train(cfg, cfg.train, hook=lambda e, d: events.append((e, d["step"]))
                            if e in ("rollout", "step") else None))
    assert res.steps_done == 3
    assert events.index(("rollout", 1)) < events.index(("step", 0))
    trajs = TrajectoryStore(cfg.store.trajectories_url).read(run_id="local-o")
    assert len(trajs) == 6 and len({t.episode_id for t in trajs}) == 6
    index = {"step-0": 1, "step-1": 2}
    for m in res.metrics:
        assert m["staleness_max"] <= 1 and m["stale_dropped"] == 0
        for t in (t for t in trajs if t.step == m["step"]):
            assert all(m["step"] - index.get(v, 0) <= 1 for v in t.weights_versions)


@pytest.mark.slow   # ~1.5 min on 2 shared cores
def test_external_sampler_serving_other_weights_mid_rollout_stops_the_ray_run(cluster, train_root):  # noqa: F811
    """train.sampler.endpoints on Ray: the workers sample from a `serve model` outside the trainer.
    Weights changed behind the trainer's back as the rollout starts: the workers refuse the tokens,
    the run stops naming the endpoint, and nothing is stored or trained on."""
    from tryloop.agent.endpoints import SamplerError
    from tryloop.agent.engine import Engine
    from tryloop.agent.hf import load_model
    from tryloop.serve.config import ServeModelConfig
    from tryloop.serve.model import model_server_in_thread
    from tryloop.train.run import train

    served = load_model("smollm2-135m", device="cpu")
    scfg = ServeModelConfig(port=0, access_log=None, weight_updates=True, threads=1)
    with Engine(served.model, served.tokenizer, weights_version=served.weights_version, num_threads=1) as engine, \
            model_server_in_thread(engine, scfg) as url:
        cfg = ray_config(train_root, "ray-e.yaml", run_id="ray-e", steps=1, sampler={"endpoints": [url]})

        def hook(event, data):
            if event == "rollout":
                engine.update_weights_blocking(engine.model, version="rogue")

        with pytest.raises(SamplerError, match=rf"{url} sampled with weights \['rogue'\] but '.*' was announced"):
            asyncio.run(train(cfg, cfg.train, hook=hook))
    assert TrajectoryStore(cfg.store.trajectories_url).read(run_id="ray-e") == []
    assert not (train_root / "runs" / "ray-e" / "metrics.jsonl").exists()


@pytest.mark.slow   # ~2 min on 2 shared cores
def test_an_overlapped_run_that_dies_mid_rollout_resumes_without_losing_or_repeating_episodes(train_root):  # noqa: F811
    """The run dies while step 1's rollout (overlapping step 0's update) has stored one of its
    episodes: the resumed run reads that one back, runs the rest, and every episode is stored once."""
    from tryloop.train.run import train

    cfg = load_yaml(write_config(train_root, "local-r.yaml", run_id="local-r", steps=3, concurrency=1,
                                 limits=SHORT, overlap=True, max_staleness=1))

    class Died(Exception):
        pass

    def hook(event, data):
        if event == "episode" and data["step"] == 1:
            raise Died()     # after the episode was stored

    with pytest.raises(Died):
        asyncio.run(train(cfg, cfg.train, hook=hook))
    store = TrajectoryStore(cfg.store.trajectories_url)
    assert len(store.read(run_id="local-r", step=1)) == 1
    assert checkpoint.latest(train_root / "runs" / "local-r").name == "step-000000"
    res = asyncio.run(train(cfg, cfg.train, resume=True))
    assert res.steps_done == 3 and [m["step"] for m in res.metrics] == [0, 1, 2]
    ids = Counter(t.episode_id for t in store.read(run_id="local-r"))
    assert len(ids) == 6 and set(ids.values()) == {1}
    assert [m["episodes"] for m in res.metrics] == [2, 2, 2]


@pytest.mark.slow   # ~2 min on 2 shared cores
def test_a_sampler_endpoint_lost_mid_step_its_requests_go_to_another_none_lost_none_twice(cluster, train_root):  # noqa: F811
    """train.sampler.endpoints on Ray, two `serve model` servers over two copies of the model. One
    stops while step 0's episodes run: the workers' requests go to the other, the step's push leaves
    the lost one out (logged), step 1 samples from the one left, and every episode is stored once,
    with tokens of the announced weights only."""
    from tryloop.agent.engine import Engine
    from tryloop.agent.hf import load_model
    from tryloop.serve.config import ServeModelConfig
    from tryloop.serve.model import model_server_in_thread
    from tryloop.train.run import train

    scfg = ServeModelConfig(port=0, access_log=None, weight_updates=True, threads=1)
    a, b = load_model("smollm2-135m", device="cpu"), load_model("smollm2-135m", device="cpu")
    with Engine(a.model, a.tokenizer, weights_version=a.weights_version, num_threads=1) as ea, \
            Engine(b.model, b.tokenizer, weights_version=b.weights_version, num_threads=1) as eb, \
            model_server_in_thread(ea, scfg) as url_a:
        lost = contextlib.ExitStack()
        url_b = lost.enter_context(model_server_in_thread(eb, scfg))
        cfg = ray_config(train_root, "ray-f.yaml", run_id="ray-f", tasks_per_step=2, group_size=2, concurrency=4,
                         scheduler={"admission": {"adaptive": False, "initial": 4, "max": 4}},
                         sampler={"endpoints": [url_a, url_b], "down_s": 300})
        logs: list[str] = []
        gone: list[str] = []

        def hook(event, data):
            if event == "episode" and data["step"] == 0 and not gone:
                gone.append(url_b)
                lost.close()        # the second sampler goes down while the step's other episodes run
            if event == "log":
                logs.append(data["message"])

        res = asyncio.run(train(cfg, cfg.train, hook=hook))
    assert gone and res.steps_done == 2 and [m["episodes"] for m in res.metrics] == [4, 4]
    assert [m["sampler_live"] for m in res.metrics] == [1, 1]
    assert any(f"did not reach sampler endpoint(s) {url_b}" in m for m in logs), logs
    trajs = TrajectoryStore(cfg.store.trajectories_url).read(run_id="ray-f")
    ids = Counter(t.episode_id for t in trajs)
    assert len(ids) == 8 and set(ids.values()) == {1}      # none lost, none counted twice
    assert {tuple(t.weights_versions) for t in trajs if t.step == 1} == {("step-0",)}
    assert eb.weights_version == b.weights_version            # the lost one never got step-0 ...
    assert ea.weights_version == "step-1"                     # ... the one left got every push


def ray_yaml(root, name: str, address: str, **train) -> str:
    """A config file for a trainer in its own process that joins the cluster at `address`."""
    path = write_config(root, name, **{"concurrency": 2, "limits": SHORT, **train})
    doc = yaml.safe_load(path.read_text())
    doc["scheduler"] = {**RAY, "ray": {**RAY["ray"], "address": address}}
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.slow   # ~5 min on 2 shared cores: two three-step runs on the cluster
def test_a_learner_killed_on_ray_resumes_like_an_uninterrupted_run(cluster, train_root, tmp_path):  # noqa: F811
    """The trainer (learner and its served model) is SIGKILLed after step 1's checkpoint while the
    Ray cluster and its nodes live on; `--resume` in a new process joins the cluster again and
    finishes. Against a run never interrupted: the same episodes, token for token, each stored
    once, the same losses and the same final weights."""
    c, _ = cluster
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    # One episode at a time, as in the one-machine resume test: batched decoding sums in another
    # order for other batch compositions, which can flip a token; one sequence at a time cannot.
    train_args = {"steps": 3, "concurrency": 1, "limits": {**SHORT, "max_new_tokens": 160, "max_total_tokens": 160}}
    cfg_a = ray_yaml(train_root, "ray-ra.yaml", c.address, run_id="ray-ra", **train_args)
    cfg_b = ray_yaml(train_root, "ray-rb.yaml", c.address, run_id="ray-rb", **train_args)
    py = sys.executable
    subprocess.run([py, str(script), cfg_a, "-1"], check=True, timeout=900)
    killed = subprocess.run([py, str(script), cfg_b, "1"], timeout=900)
    assert killed.returncode == -signal.SIGKILL
    run_a, run_b = train_root / "runs" / "ray-ra", train_root / "runs" / "ray-rb"
    assert checkpoint.latest(run_b).name == "step-000001"
    steps_before_kill = learner_steps(run_b)
    subprocess.run([py, str(script), cfg_b, "-1", "--resume"], check=True, timeout=900)
    store = TrajectoryStore(str(train_root / "traj"))
    a = {t.episode_id.split(":", 1)[1]: t for t in store.read(run_id="ray-ra")}
    b_all = store.read(run_id="ray-rb")
    b = {t.episode_id.split(":", 1)[1]: t for t in b_all}
    assert sorted(a) == sorted(b) and len(a) == len(b_all) == 6          # nothing lost, nothing twice
    for k in a:
        assert a[k].token_ids == b[k].token_ids, k                      # the same episodes, token for token
        assert a[k].weights_versions == b[k].weights_versions, k
    ma = [json.loads(x) for x in (run_a / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x) for x in (run_b / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in mb] == [0, 1, 2]
    assert [m.get("learn_loss") for m in ma] == [m.get("learn_loss") for m in mb]
    assert checkpoint.latest(run_b).name == "step-000002"
    assert learner_steps(run_b) == learner_steps(run_a) >= steps_before_kill
    assert weights_digest(run_b) == weights_digest(run_a)


@pytest.mark.slow   # ~45 s on 2 shared cores
def test_overlap_with_an_external_sampler_samples_through_the_push_within_the_bound(train_root):  # noqa: F811
    """train.overlap with train.sampler.endpoints on the local engine: the next step's episodes sample
    from the server while the learner updates and pushes to it; every trajectory within the bound,
    each stored once, the server left with the last step's weights."""
    from tryloop.agent.engine import Engine
    from tryloop.agent.hf import load_model
    from tryloop.serve.config import ServeModelConfig
    from tryloop.serve.model import model_server_in_thread
    from tryloop.train.run import train

    served = load_model("smollm2-135m", device="cpu")
    scfg = ServeModelConfig(port=0, access_log=None, weight_updates=True, threads=1)
    with Engine(served.model, served.tokenizer, weights_version=served.weights_version, num_threads=1) as engine, \
            model_server_in_thread(engine, scfg) as url:
        cfg = load_yaml(write_config(train_root, "local-oe.yaml", run_id="local-oe", steps=3, concurrency=2,
                                     limits=SHORT, overlap=True, max_staleness=1, sampler={"endpoints": [url]}))
        events: list[tuple[str, int]] = []
        res = asyncio.run(train(cfg, cfg.train, hook=lambda e, d: events.append((e, d["step"]))
                                if e in ("rollout", "step") else None))
        assert engine.weights_version == "step-2"
    assert res.steps_done == 3
    assert events.index(("rollout", 1)) < events.index(("step", 0))
    trajs = TrajectoryStore(cfg.store.trajectories_url).read(run_id="local-oe")
    assert len(trajs) == 6 and len({t.episode_id for t in trajs}) == 6
    index = {served.weights_version: 0, "step-0": 1, "step-1": 2}
    for m in res.metrics:
        assert m["staleness_max"] <= 1 and m["sampler_live"] == 1
        for t in (t for t in trajs if t.step == m["step"]):
            assert all(m["step"] - index[v] <= 1 for v in t.weights_versions), t.weights_versions


@pytest.mark.slow   # ~1 min on 2 shared cores
def test_an_overlapped_run_whose_sampler_goes_back_to_old_weights_stops_instead_of_resampling_forever(train_root):  # noqa: F811
    """train.overlap, max_staleness 0: step 1's episodes sampled during step 0's update are too stale
    and are sampled again once step-0 is out. The sampler then goes back to the initial weights (a
    restart): what it samples now can never be fresh enough, and the run stops naming the weights,
    rather than sampling the same episodes again and again; nothing of the old weights is stored."""
    from tryloop.agent.engine import Engine
    from tryloop.agent.hf import load_model
    from tryloop.serve.config import ServeModelConfig
    from tryloop.serve.model import model_server_in_thread
    from tryloop.train.run import train

    served = load_model("smollm2-135m", device="cpu")
    initial = {k: v.detach().clone() for k, v in served.model.state_dict().items()}
    scfg = ServeModelConfig(port=0, access_log=None, weight_updates=True, threads=1)
    with Engine(served.model, served.tokenizer, weights_version=served.weights_version, num_threads=1) as engine, \
            model_server_in_thread(engine, scfg) as url:
        cfg = load_yaml(write_config(train_root, "local-os.yaml", run_id="local-os", steps=3, concurrency=1,
                                     overlap=True, max_staleness=0, sampler={"endpoints": [url]}))

        def hook(event, data):
            # Once step-0 is out the server restarts: at the end of step 0, or at the latest when the
            # first of step 1's episodes (one at a time) is stored, so the next cannot be fresh.
            due = (event, data.get("step")) == ("step", 0) or (event == "episode" and data["step"] >= 1)
            if due and engine.weights_version != served.weights_version:
                engine.update_weights_blocking(initial, version=served.weights_version)

        with pytest.raises(TryloopError, match=r"sampled again after weights 'step-0' were pushed, but holds tokens "
                                               rf"of \[.*'{served.weights_version}'.*\].*restarted"):
            asyncio.run(train(cfg, cfg.train, hook=hook))
    # What step 1 stored (an episode that finished before the restart) holds step-0's tokens only.
    kept = TrajectoryStore(cfg.store.trajectories_url).read(run_id="local-os", step=1)
    assert all(t.weights_versions == ["step-0"] for t in kept), [t.weights_versions for t in kept]
