"""Model policies in real episodes: an OpenAI-compatible server (a real HTTP server with a
scripted model) and the bundled SmolLM2, acting through the tools in real sandboxes."""

from __future__ import annotations

import pytest

from tryloop.agent.environments import Environments
from tryloop.agent.episode import EpisodeLimits, EpisodeRequest, run_episode
from tryloop.agent.openai_policy import OpenAIPolicy
from tryloop.agent.tools import TOOL_NAMES
from tryloop.llm.scripted_server import ScriptedReply, ScriptedServer


@pytest.fixture
async def envs(runtime):
    e = Environments(runtime)
    yield e
    await e.close()


async def episode(srv: ScriptedServer, task, envs, *, token_ids: bool = False, **limits):
    policy = OpenAIPolicy(srv.url, srv.model, token_ids=token_ids, timeout_s=30)
    try:
        return await run_episode(EpisodeRequest(f"openai-{task.id}", task), policy, envs,
                                 limits=EpisodeLimits(**limits) if limits else None)
    finally:
        await policy.aclose()


def tool_messages(body: dict) -> list[dict]:
    return [m for m in body["messages"] if m["role"] == "tool"]


# --- OpenAI-compatible server ------------------------------------------------------------------


async def test_native_tool_calls_turn_by_turn_solve_the_task(envs, task):
    solution = task.solution_files()
    first = next(iter(solution))
    script = [ScriptedReply.call("view", {"path": first}, text="Let me read it first."),
              *[ScriptedReply.call("write", {"path": p, "content": d.decode()}) for p, d in solution.items()],
              ScriptedReply.call("submit", {})]
    with ScriptedServer(script) as srv:
        t = await episode(srv, task, envs, token_ids=True)
        bodies = srv.bodies()
    assert not srv.errors
    assert t.termination == "submitted" and t.verdict == "pass", t.verdict_reason
    assert t.reward_components["correctness"] == 1.0 and t.reward > 0
    assert [c.name for turn in t.turns for c in turn.tool_calls] == \
        ["view", *["write"] * len(solution), "submit"]
    assert t.turns[0].text == "Let me read it first." and t.turns[0].observations[0].ok
    assert set(t.changes) == set(solution)
    # Every request offered the tools natively; the view's output came back answering its call by id.
    assert len(bodies) == len(script)
    assert all([s["function"]["name"] for s in b["tools"]] == TOOL_NAMES for b in bodies)
    view_answer = tool_messages(bodies[1])
    assert len(view_answer) == 1 and view_answer[0]["tool_call_id"] == "call_1_0"
    assert view_answer[0]["content"] == t.turns[0].observations[0].content
    assert bodies[1]["messages"][2]["tool_calls"][0]["id"] == "call_1_0"
    # The scripted server re-renders the history as text: its next prompt does not extend the
    # ids already logged, so the session stops vouching for the tokens instead of guessing.
    assert t.token_source == "unavailable"
    assert t.policy == f"openai:{srv.model}" and t.reward_version


async def test_server_token_ids_and_logprobs_make_a_consistent_token_log(envs, task):
    calls = tuple(("write", {"path": p, "content": d.decode()}) for p, d in task.solution_files().items())
    sampled, lps = [11, 12, 13, 14, 15], [-0.5, -0.25, -1.0, -0.125, -2.0]
    reply = ScriptedReply(tool_calls=(*calls, ("submit", {})), token_ids=sampled, logprobs=lps)
    with ScriptedServer([reply]) as srv:
        t = await episode(srv, task, envs, token_ids=True)
        body = srv.bodies()[0]
    assert body["return_token_ids"] and body["logprobs"]
    assert t.termination == "submitted" and t.verdict == "pass", t.verdict_reason
    assert t.token_source == "server"
    n, p = len(t.token_ids), t.prompt_length
    assert p > 0 and n == p + len(sampled) == len(t.logprobs) == len(t.loss_mask)
    assert t.loss_mask == [0] * p + [1] * len(sampled)
    assert t.token_ids[p:] == sampled and t.logprobs[p:] == lps and t.logprobs[:p] == [0.0] * p
    assert t.completion_tokens == len(sampled)


@pytest.mark.parametrize("token_data", [True, False], ids=["not-asked", "server-has-none"])
async def test_no_token_data_means_unavailable(envs, task, token_data):
    # Asking a server that offers nothing, or not asking at all: no ids are logged, none invented.
    with ScriptedServer([ScriptedReply.call("submit", {})], token_data=token_data) as srv:
        t = await episode(srv, task, envs, token_ids=not token_data)
    assert t.termination == "submitted" and t.verdict == "fail"
    assert t.token_source == "unavailable"
    assert t.token_ids == [] and t.logprobs == [] and t.loss_mask == [] and t.prompt_length == 0


async def test_a_server_fault_is_raised_for_the_scheduler_and_a_refusal_ends_the_episode(envs, task):
    from tryloop.agent.policy import PolicyError

    first = next(iter(task.workspace_files()))
    script = [ScriptedReply.call("view", {"path": first}), ScriptedReply.error(500, "the GPU caught fire")]
    with ScriptedServer(script) as srv, pytest.raises(PolicyError) as err:
        await episode(srv, task, envs, max_turns=5)
    assert err.value.retryable and "500" in str(err.value)   # retried by the scheduler, not scored
    script = [ScriptedReply.call("view", {"path": first}), ScriptedReply.error(400, "the GPU caught fire")]
    with ScriptedServer(script) as srv:
        t = await episode(srv, task, envs, max_turns=5)
    assert t.termination == "error"
    assert t.error.startswith("turn 1:") and "400" in t.error and "the GPU caught fire" in t.error
    assert len(t.turns) == 1 and t.turns[0].observations[0].ok
    assert t.verdict == "fail" and t.reward_version          # still judged, on what it left


async def test_malformed_arguments_become_an_error_observation_and_the_episode_goes_on(envs, task):
    first = next(iter(task.workspace_files()))
    both = ScriptedReply(tool_calls=(("view", {"path": first}), ("write", '{"path": "x.py", "content": ')))
    with ScriptedServer([both, ScriptedReply.call("submit", {})]) as srv:
        t = await episode(srv, task, envs)
        second = srv.bodies()[1]
    assert t.termination == "submitted" and len(t.turns) == 2
    parse, view = t.turns[0].observations
    assert not parse.ok and parse.content.startswith("error: could not read your tool call: write:")
    assert view.name == "view" and view.ok and "x.py" not in t.changes
    # Each call is answered by its own id: the view with its output, the malformed write with the error.
    answers = {m["tool_call_id"]: m["content"] for m in tool_messages(second)}
    assert answers["call_1_0"] == view.content
    assert answers["call_1_1"].startswith("error:") and "not valid JSON" in answers["call_1_1"]
    assert not any(m["role"] == "user" and m["content"] == view.content for m in second["messages"])


async def test_a_humaneval_reply_that_is_one_code_block_writes_and_submits(envs, tmp_path):
    from tryloop.tasks.sources.humaneval import humaneval_task, load_humaneval

    problem = load_humaneval()[0]
    he = humaneval_task(problem, tmp_path / "he0")
    assert he.meta.answer_file == "solution.py"
    code = problem["prompt"] + problem["canonical_solution"]
    with ScriptedServer([f"Here it is:\n```python\n{code}```\n"]) as srv:
        t = await episode(srv, he, envs)
    assert [c.name for c in t.turns[0].tool_calls] == ["write", "submit"]
    assert t.termination == "submitted" and t.verdict == "pass", t.verdict_reason
    assert t.reward_components["correctness"] == 1.0 and t.reward > 0


# --- the bundled SmolLM2 -------------------------------------------------------------------------


async def test_hf_policy_episode_is_token_exact(envs, task, smollm2, one_thread):
    from tryloop.agent.hf_policy import HFPolicy

    policy = HFPolicy(smollm2, max_new_tokens=48, num_threads=1, max_batch=1)
    try:
        t = await run_episode(EpisodeRequest("smollm2", task, seed=1), policy, envs,
                              limits=EpisodeLimits(max_turns=2))
    finally:
        policy.close()
    ids, lps, mask = t.token_ids, t.logprobs, t.loss_mask
    assert t.token_source == "exact" and t.policy_version == smollm2.weights_version
    assert len(ids) == len(lps) == len(mask) and t.prompt_length > 0
    assert not any(mask[: t.prompt_length]) and mask[t.prompt_length] == 1
    # The masked-in runs are exactly the turns, in order, and decode to what each turn said.
    segments, run = [], []
    for i, m in enumerate(mask):
        if m:
            run.append(i)
        elif run:
            segments.append(run)
            run = []
    if run:
        segments.append(run)
    assert len(segments) == len(t.turns) >= 1
    tok = smollm2.tokenizer
    for seg, turn in zip(segments, t.turns, strict=True):
        assert tok.decode([ids[i] for i in seg], skip_special_tokens=True) == turn.text
        assert len(seg) == turn.completion_tokens
    policy_lps = [lp for lp, m in zip(lps, mask, strict=True) if m]
    assert all(lp <= 0 for lp in policy_lps) and all(lp != 0 for lp in policy_lps)
    assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if not m)
    assert t.termination in ("submitted", "turn_limit", "context_full")
    assert t.verdict in ("pass", "fail") and t.reward_version
    assert {"model", "env", "verify"} <= set(t.times) and t.times["model"] > 0 and t.times["verify"] > 0


def test_sampling_temperature_is_restored_after_the_block_and_after_an_error():
    from tryloop.agent.policy import sampling_temperature

    class P:
        temperature = 0.7

    p = P()
    with sampling_temperature(p, 0.0):
        assert p.temperature == 0.0
    assert p.temperature == 0.7
    with pytest.raises(RuntimeError), sampling_temperature(p, 1.3):
        assert p.temperature == 1.3
        raise RuntimeError("episode failed")
    assert p.temperature == 0.7
    scripted = object()   # no temperature: left alone
    with sampling_temperature(scripted, 0.0):
        assert not hasattr(scripted, "temperature")
