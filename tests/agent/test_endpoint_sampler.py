"""Samplers are endpoints: `tryloop serve model` as a trainer's sampler over real HTTP — token-exact
sessions, weights pushed with a version (in the body and from a shared path), every turn
recording the version that sampled it, and the failures a trainer must not train through: an
endpoint serving other weights than announced, and one that is down."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
import torch

from tryloop.agent.endpoints import EndpointSampler, SamplerError
from tryloop.agent.engine import Engine
from tryloop.agent.hf_policy import HFPolicy
from tryloop.serve.config import ServeModelConfig
from tryloop.serve.model import model_server_in_thread

KEY_ENV = "TRYLOOP_TEST_SAMPLER_KEY"


@pytest.fixture(scope="module")
def served(one_thread):
    """A server over its own copy of the model (pushes change its weights), with an API key."""
    from tryloop.agent.hf import load_model

    mp = pytest.MonkeyPatch()
    mp.setenv(KEY_ENV, "sekret")
    loaded = load_model("smollm2-135m", device="cpu")
    cfg = ServeModelConfig(port=0, default_max_tokens=8, access_log=None, weight_updates=True,
                           auth_token_env=KEY_ENV)
    with Engine(loaded.model, loaded.tokenizer, weights_version=loaded.weights_version) as engine, \
            model_server_in_thread(engine, cfg) as url:
        yield url, engine, loaded
    mp.undo()


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def one_turn(policy: HFPolicy):
    session = policy.session("You are helpful.", "Say hi.", seed=3)
    return await session.act(None), session


async def test_push_over_http_then_sessions_carry_the_new_version(served, smollm2, tmp_path):
    url, engine, loaded = served
    initial = loaded.weights_version
    sampler = EndpointSampler([url], api_key="sekret")
    await sampler.connect(initial)
    policy = HFPolicy(smollm2, temperature=0.0, max_new_tokens=4, engine=sampler)
    action, session = await one_turn(policy)
    assert action.weights_versions == (initial,) and policy.version == initial
    assert session.tokens.source == "exact" and sum(session.tokens.mask) == action.completion_tokens > 0
    before = session.tokens.logprobs[-action.completion_tokens:]

    # The same weights as bytes in the body: the version changes, the tokens do not.
    state = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    push_s = await sampler.push(state, version="step-0")
    models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer sekret"}).json()["data"][0]
    assert models["weights_version"] == "step-0" and engine.weights_version == "step-0"
    action, session = await one_turn(policy)
    assert action.weights_versions == ("step-0",)
    assert session.tokens.logprobs[-action.completion_tokens:] == pytest.approx(before, abs=1e-4)

    # Other weights from a shared path: the server samples with them.
    state["model.norm.weight"] = state["model.norm.weight"] * 0.5
    file_sampler = EndpointSampler([url], api_key="sekret", weights_dir=tmp_path)
    await file_sampler.connect("step-0")
    await file_sampler.push(state, version="step-1")
    assert (tmp_path / "step-1.safetensors").exists()
    policy2 = HFPolicy(smollm2, temperature=0.0, max_new_tokens=4, engine=file_sampler)
    action, session = await one_turn(policy2)
    assert action.weights_versions == ("step-1",)
    assert session.tokens.logprobs[-action.completion_tokens:] != pytest.approx(before, abs=1e-3)
    # The first sampler was not told of step-1: what it gets now is off-policy, and it says so.
    with pytest.raises(SamplerError, match=r"sampled with weights \['step-1'\] but 'step-0' was announced"):
        await sampler.generate(session.tokens.ids[:8], max_new_tokens=2)
    with pytest.raises(SamplerError, match="announced"):      # and it stays failed
        sampler.check()

    # Push latency of the 135M model, bytes in the body (the figure docs/train.md quotes).
    t0 = time.perf_counter()
    await file_sampler.push(engine.model.state_dict(), version="step-2")
    print(f"push: {push_s * 1e3:.0f} ms (body), {(time.perf_counter() - t0) * 1e3:.0f} ms (shared path)")
    await sampler.aclose()
    await file_sampler.aclose()


async def test_requests_are_spread_over_the_endpoints_and_pushes_reach_each(served, tmp_path):
    import asyncio

    url, engine, loaded = served
    cfg = ServeModelConfig(port=0, access_log=None, weight_updates=True, auth_token_env=KEY_ENV)
    with model_server_in_thread(engine, cfg) as url2:      # a second endpoint (over the same engine)
        s = EndpointSampler([url, url2], api_key="sekret", weights_dir=tmp_path)
        await s.connect(engine.weights_version)
        outs = await asyncio.gather(*[s.generate([1, 2, 3], max_new_tokens=2, temperature=0.0) for _ in range(4)])
        assert sorted(o.endpoint for o in outs) == sorted([url, url, url2, url2])
        assert [ep.requests for ep in s.endpoints] == [2, 2]
        # While a push is under way every endpoint stays usable (overlapped rollouts sample through
        # it): none switches to the new version before the last one has answered.
        real, usable = s._push_one, []

        async def watched(ep, *args):
            out = await real(ep, *args)
            usable.append(len(s._order()))
            return out

        s._push_one = watched
        await s.push(engine.model.state_dict(), version="spread-1")
        assert usable == [2, 2] and s.live() == [url, url2]
        assert [len(ep.push_s) for ep in s.endpoints] == [1, 1] and engine.weights_version == "spread-1"
        out = await s.generate([1, 2, 3], max_new_tokens=2, temperature=0.0)
        assert out.weights_versions == ("spread-1",)
        await s.aclose()


async def test_a_server_with_other_weights_than_announced_is_refused_at_connect(served):
    url, engine, loaded = served
    sampler = EndpointSampler([url], api_key="sekret")
    with pytest.raises(SamplerError, match=f"{url} serves weights .* but the learner starts from 'sha256:nope'"):
        await sampler.connect("sha256:nope")


async def test_a_dead_endpoint_is_named_and_a_live_one_takes_its_requests(served):
    url, engine, loaded = served
    dead = dead_url()
    with pytest.raises(SamplerError, match=f"{dead}: GET /v1/models failed"):
        await EndpointSampler([dead, url], api_key="sekret").connect(engine.weights_version)
    # Down after the start: the request goes to the next endpoint (retries: 1) ...
    both = EndpointSampler([url, dead], api_key="sekret", retries=1)
    both.announced = engine.weights_version
    for ep in both.endpoints:
        ep.model, ep.version = "smollm2-135m", engine.weights_version
    ids = [1, 2, 3]
    for _ in range(2):   # one of the two starts at the dead endpoint
        s = await both.generate(ids, max_new_tokens=2, temperature=0.0)
        assert s.endpoint == url and len(s.token_ids) == len(s.policy_logprobs) > 0
    assert both.stats()[dead]["failures"] == 1   # set aside after its first failure: asked only once
    # ... and with none left, the error names it, and the sampler stays failed.
    alone = EndpointSampler([dead], retries=3)
    alone.announced = alone.endpoints[0].version = engine.weights_version
    with pytest.raises(SamplerError, match=f"no sampler endpoint answered with usable tokens.*: {dead}: ConnectError"):
        await alone.generate(ids, max_new_tokens=2)
    with pytest.raises(SamplerError, match=dead):
        alone.check()
    # A push that reaches no endpoint names it.
    with pytest.raises(SamplerError, match=f"weights 'v' reached no sampler endpoint: {dead}: ConnectError"):
        await alone.push({"w": torch.zeros(1)}, version="v")
    await both.aclose()


async def test_a_lost_endpoint_is_left_out_until_a_push_reaches_it_and_its_requests_go_elsewhere(served):
    """Two servers over two copies of the model. One stops: its requests go to the other, the next
    push leaves it out, and it gets no request while it holds older weights, even once it is back;
    the push after that reaches it again. One that answers with weights nobody announced is set
    aside and the completion asked of the other; with no endpoint left the error names both."""
    import asyncio
    import contextlib

    from tryloop.agent.hf import load_model

    url, engine, loaded = served
    other = load_model("smollm2-135m", device="cpu")
    port = int(dead_url().rsplit(":", 1)[1])
    cfg = ServeModelConfig(port=port, default_max_tokens=8, access_log=None, weight_updates=True,
                           auth_token_env=KEY_ENV)
    ids = [1, 2, 3]
    with Engine(other.model, other.tokenizer, weights_version=engine.weights_version) as engine2:
        stack = contextlib.ExitStack()
        url2 = stack.enter_context(model_server_in_thread(engine2, cfg))
        s = EndpointSampler([url, url2], api_key="sekret", down_s=60)
        await s.connect(engine.weights_version)
        outs = await asyncio.gather(*[s.generate(ids, max_new_tokens=2, temperature=0.0) for _ in range(4)])
        assert {o.endpoint for o in outs} == {url, url2}
        stack.close()                                  # the second server is gone
        outs = await asyncio.gather(*[s.generate(ids, max_new_tokens=2, temperature=0.0) for _ in range(4)])
        assert {o.endpoint for o in outs} == {url} and s.stats()[url2]["failures"] >= 1
        await s.push(engine.model.state_dict(), version="lost-1")
        assert s.live() == [url]
        assert s.stats()[url2]["missed_pushes"] == 1 and not s.stats()[url2]["live"]
        with model_server_in_thread(engine2, cfg):     # back, with the weights it had
            s.endpoints[1].down_until = 0.0            # (its time out is over)
            outs = await asyncio.gather(*[s.generate(ids, max_new_tokens=2) for _ in range(4)])
            assert {o.endpoint for o in outs} == {url} and {o.weights_versions for o in outs} == {("lost-1",)}
            await s.push(engine.model.state_dict(), version="lost-2")
            assert s.live() == [url, url2] and engine2.weights_version == "lost-2"
            outs = await asyncio.gather(*[s.generate(ids, max_new_tokens=2) for _ in range(4)])
            assert {o.endpoint for o in outs} == {url, url2}
            # Someone else's weights on the second: its tokens are refused, the first answers.
            engine2.update_weights_blocking(engine2.model, version="rogue")
            failed = s.stats()[url2]["failures"]
            outs = await asyncio.gather(*[s.generate(ids, max_new_tokens=2) for _ in range(4)])
            assert {o.endpoint for o in outs} == {url} and {o.weights_versions for o in outs} == {("lost-2",)}
            assert s.stats()[url2]["failures"] > failed
            # Nothing usable anywhere: the error names both.
            engine.update_weights_blocking(engine.model, version="rogue")
            for ep in s.endpoints:
                ep.down_until = 0.0
            with pytest.raises(SamplerError, match=rf"{url} sampled with weights \['rogue'\].*{url2}|"
                                                   rf"{url2} sampled with weights \['rogue'\].*{url}"):
                await s.generate(ids, max_new_tokens=2)
            engine.update_weights_blocking(engine.model, version="lost-2")
        await s.aclose()


async def test_the_weights_endpoint_is_authenticated_and_checks_what_it_gets(served, tmp_path):
    url, engine, loaded = served
    key = {"Authorization": "Bearer sekret"}
    async with httpx.AsyncClient(base_url=url) as http:
        r = await http.post("/v1/weights", json={"path": "/x", "version": "v"})
        assert r.status_code == 401
        r = await http.post("/v1/weights", json={"path": str(tmp_path / "none.safetensors"), "version": "v"},
                            headers=key)
        assert r.status_code == 400 and "cannot read weights" in r.json()["error"]["message"]
        r = await http.post("/v1/weights", content=b"junk", headers={**key, "Content-Type": "application/octet-stream"})
        assert r.status_code == 400 and "X-Weights-Version" in r.json()["error"]["message"]
        from tryloop.agent import weights_io

        wrong = weights_io.to_bytes({"nope": torch.zeros(2)}, version="v")
        r = await http.post("/v1/weights", content=wrong, headers={**key, "Content-Type": "application/octet-stream",
                                                                   "X-Weights-Version": "v"})
        assert r.status_code == 400 and "do not fit the served model" in r.json()["error"]["message"]
        assert engine.weights_version != "v"
        r = await http.post("/v1/weights", content=b"x", headers={**key, "Content-Type": "text/plain"})
        assert r.status_code == 415


async def test_weight_updates_are_off_unless_enabled(smollm2, one_thread):
    with Engine(smollm2.model, smollm2.tokenizer, weights_version="w0") as engine, \
            model_server_in_thread(engine, ServeModelConfig(port=0, access_log=None)) as url:
        r = httpx.post(f"{url}/v1/weights", json={"path": "/x", "version": "v"})
        assert r.status_code == 403 and "serve.model.weight_updates" in r.json()["error"]["message"]
        assert engine.weights_version == "w0"


@pytest.mark.parametrize("via", ["bytes", "file"])
def test_tied_tensors_travel_once_and_come_back_under_every_name(via, tmp_path):
    from tryloop.agent import weights_io

    shared = torch.randn(3, 2)
    state = {"embed.weight": shared, "lm_head.weight": shared, "norm.weight": torch.ones(2)}
    if via == "bytes":
        data = weights_io.to_bytes(state, version="v1")
        assert len(data) < 3 * 2 * 4 * 2 + 1024          # the shared tensor once
        back = weights_io.from_bytes(data)
    else:
        back = weights_io.from_file(weights_io.to_file(state, tmp_path / "w.safetensors", version="v1"))
        assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]    # no temporary left
    assert sorted(back) == sorted(state) and all(torch.equal(back[k], state[k]) for k in state)
    assert back["embed.weight"].data_ptr() == back["lm_head.weight"].data_ptr()


def test_an_episode_of_weights_the_step_did_not_announce_is_refused():
    from tryloop.agent.trajectory import Trajectory
    from tryloop.errors import TryloopError
    from tryloop.train.run import _check_versions

    t = Trajectory(episode_id="e", task_id="t", weights_versions=["step-1", "step-2"])
    _check_versions(t, {"step-1", "step-2"})
    with pytest.raises(TryloopError, match=r"episode e was sampled with weights \['step-2'\], but this step "
                                           r"samples with \['step-1'\]: refusing off-policy data"):
        _check_versions(t, {"step-1"})
    _check_versions(Trajectory(episode_id="old", task_id="t"), {"step-1"})   # stored before versions were


class _Config:
    """Stands in for a transformers config: what the sampler writes beside vLLM's / SGLang's weights."""

    def save_pretrained(self, folder: str) -> None:
        from pathlib import Path

        (Path(folder) / "config.json").write_text('{"model_type": "llama"}')


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_vllm_and_sglang_get_their_request_shapes(kind, tmp_path):
    """Not vLLM or SGLang themselves (neither installs here): a stand-in that records what the
    sampler sends, in the shapes of their docs, and answers as they do."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from tryloop.serve.asgi import server_in_thread

    seen: list[tuple[str, dict]] = []

    async def record(request: Request) -> JSONResponse:
        body = await request.json() if request.method == "POST" else {}
        seen.append((request.url.path, body))
        if request.url.path == "/v1/models":
            return JSONResponse({"data": [{"id": "m", "max_model_len": 2048}]})
        if request.url.path == "/v1/completions":
            return JSONResponse({"choices": [{"text": "x", "token_ids": [5, 6], "finish_reason": "length",
                                              "logprobs": {"token_logprobs": [-0.5, -1.5], "tokens": ["a", "b"]}}]})
        return JSONResponse({"success": True, "message": "ok"} if kind == "sglang" else {"results": [None]})

    app = Starlette(routes=[Route(p, record, methods=["GET", "POST"]) for p in
                            ("/v1/models", "/v1/completions", "/update_weights_from_disk", "/collective_rpc")])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    with server_in_thread(server, what="stand-in") as url:
        s = EndpointSampler([url], kind=kind, weights_dir=tmp_path, model_config=_Config())
        await s.connect("w0")
        assert s.max_context == 2048
        out = await s.generate([1, 2], max_new_tokens=2, temperature=1.0, seed=4)
        assert out.token_ids == [5, 6] and out.policy_logprobs == [-0.5, -1.5] and out.weights_versions == ("w0",)
        path, body = seen[-1]
        assert path == "/v1/completions" and body["prompt"] == [1, 2] and body["return_token_ids"] is True
        assert body["logprobs"] == 0 and body["model"] == "m" and body["seed"] == 4
        await s.push({"w": torch.ones(2)}, version="step-0")
        folder = tmp_path / "step-0"
        assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
        path, body = seen[-1]
        if kind == "sglang":
            assert path == "/update_weights_from_disk"
            assert body == {"model_path": str(folder.resolve()), "weight_version": "step-0"}
        else:
            assert path == "/collective_rpc"
            assert body == {"method": "reload_weights", "kwargs": {"weights_path": str(folder.resolve())}}
        out = await s.generate([1, 2], max_new_tokens=2)
        assert out.weights_versions == ("step-0",)     # the version it acknowledged
        await s.aclose()


def test_an_endpoint_whose_time_out_is_over_is_ordered_by_load_again():
    """Once `down_s` has passed, an endpoint that failed once is one like the others: the least
    loaded goes first, not whichever never failed."""
    s = EndpointSampler(["http://a:1", "http://b:1"], down_s=5.0)
    a, b = s.endpoints
    a.down_until = time.monotonic() - 1.0     # set aside once, its time out over
    b.in_flight = 3
    assert [ep.url for ep in s._order()] == ["http://a:1", "http://b:1"]
    a.down_until = time.monotonic() + 60.0    # still set aside: last whatever the load
    assert [ep.url for ep in s._order()] == ["http://b:1", "http://a:1"]


async def test_a_worker_starting_while_an_endpoint_is_lost_sets_it_aside(served):
    """A rollout worker that starts mid-run (a new node, a restarted actor) while one endpoint is
    down connects to the others and sets that one aside; with none answering it is an error."""
    url, engine, loaded = served
    dead = dead_url()
    worker = EndpointSampler([dead, url], api_key="sekret", check_versions=False, down_s=60)
    await worker.connect("", check_version=False, all_up=False)
    assert worker.stats()[dead]["failures"] == 1 and worker.endpoints[0].model == worker.endpoints[1].model != ""
    outs = [await worker.generate([1, 2, 3], max_new_tokens=2, temperature=0.0) for _ in range(3)]
    assert {o.endpoint for o in outs} == {url}
    with pytest.raises(SamplerError, match=f"sampler endpoints not ready: {dead}: GET /v1/models failed"):
        await EndpointSampler([dead], check_versions=False).connect("", check_version=False, all_up=False)
    await worker.aclose()


async def test_an_answer_that_is_not_json_is_asked_of_another_endpoint(served):
    """A proxy's error page with status 200, say: not a completion; the other endpoint answers."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    from tryloop.serve.asgi import server_in_thread

    url, engine, loaded = served

    async def models(request):
        return JSONResponse({"data": [{"id": "smollm2-135m", "weights_version": engine.weights_version}]})

    async def junk(request):
        return PlainTextResponse("<html>gateway says hello</html>")

    app = Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", junk, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    with server_in_thread(server, what="junk") as bad:
        s = EndpointSampler([bad, url], api_key="sekret")
        await s.connect(engine.weights_version)
        outs = [await s.generate([1, 2, 3], max_new_tokens=2, temperature=0.0) for _ in range(2)]
        assert {o.endpoint for o in outs} == {url} and s.stats()[bad]["failures"] == 1
        alone = EndpointSampler([bad])
        await alone.connect(engine.weights_version)
        with pytest.raises(SamplerError, match="its answer is not JSON: .*gateway says hello"):
            await alone.generate([1, 2, 3], max_new_tokens=2)
        await s.aclose()
