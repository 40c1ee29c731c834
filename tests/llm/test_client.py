"""ChatClient against a real HTTP server (ScriptedServer): parsing, token data, typed errors, retries."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
import warnings

import pytest

from tryloop.errors import TryloopError
from tryloop.llm import (
    ChatClient,
    LLMConnectionError,
    LLMHTTPError,
    LLMProtocolError,
    LLMTimeout,
    ScriptedReply,
    ScriptedServer,
)

USER = [{"role": "user", "content": "list the files"}]
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def _client(srv: ScriptedServer, **kw) -> ChatClient:
    kw.setdefault("timeout_s", 5.0)
    return ChatClient(srv.url, srv.model, **kw)


async def test_text_reply_usage_and_request_shape():
    with ScriptedServer([ScriptedReply.say("hello there")]) as srv:
        async with _client(srv) as client:
            r = await client.chat(USER, temperature=0.0, max_tokens=64, stop=["\n\n"], seed=7)
        body = srv.bodies()[0]
    assert (r.text, r.finish_reason, r.model, r.attempts) == ("hello there", "stop", "scripted-model", 1)
    assert r.tool_calls == [] and r.usage is not None and r.usage.completion_tokens == 2
    assert (r.token_ids, r.logprobs) == (None, None)        # not asked for
    assert r.latency_s > 0
    assert body == {"model": "scripted-model", "messages": USER, "temperature": 0.0, "max_tokens": 64,
                    "stop": ["\n\n"], "seed": 7}


async def test_base_url_with_or_without_v1():
    with ScriptedServer(["a", "b"]) as srv:
        for url in (srv.url, srv.url + "/v1/"):
            async with ChatClient(url, srv.model, timeout_s=5) as client:
                assert (await client.chat(USER)).text in ("a", "b")
                assert await client.health()


async def test_tool_calls_are_parsed_and_tools_sent():
    reply = ScriptedReply(tool_calls=(("bash", {"cmd": "ls -la"}), ("view", {"path": "a.py", "lines": [1, 9]})))
    with ScriptedServer([reply]) as srv:
        async with _client(srv) as client:
            r = await client.chat(USER, tools=TOOLS, tool_choice="auto")
        body = srv.bodies()[0]
    assert body["tools"] == TOOLS and body["tool_choice"] == "auto"
    assert r.finish_reason == "tool_calls" and r.text == ""
    assert [(c.name, c.arguments, c.parse_error) for c in r.tool_calls] == [
        ("bash", {"cmd": "ls -la"}, None), ("view", {"path": "a.py", "lines": [1, 9]}, None)]
    assert all(c.id for c in r.tool_calls) and len({c.id for c in r.tool_calls}) == 2


async def test_malformed_tool_arguments_are_kept_not_raised():
    reply = ScriptedReply(text="calling", tool_calls=(
        ("bash", '{"cmd": "ls"'),          # cut JSON
        ("bash", "[1, 2]"),                # JSON, but not an object
        ("noargs", ""),                    # no arguments at all: an empty object
    ))
    with ScriptedServer([reply]) as srv:
        async with _client(srv) as client:
            r = await client.chat(USER, tools=TOOLS)
    cut, listed, empty = r.tool_calls
    assert r.text == "calling"
    assert cut.arguments == '{"cmd": "ls"' and "not valid JSON" in (cut.parse_error or "")
    assert listed.arguments == "[1, 2]" and "list, not an object" in (listed.parse_error or "")
    assert empty.arguments == {} and empty.parse_error is None


async def test_tool_call_without_a_name_is_a_protocol_error():
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": None,
                                                "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]},
                                    "finish_reason": "tool_calls"}]})
    with ScriptedServer([ScriptedReply.malformed(body)]) as srv:
        async with _client(srv) as client:
            with pytest.raises(LLMProtocolError, match=r"tool_calls\[0\]\.function\.name"):
                await client.chat(USER)


async def test_vllm_token_ids_and_logprobs():
    reply = ScriptedReply.say("x = 1", token_ids=[11, 22, 33], logprobs=[-0.25, -1.5, -0.0])
    with ScriptedServer([reply, ScriptedReply.say("done")]) as srv:
        async with _client(srv, request_token_ids=True) as client:
            r = await client.chat(USER, logprobs=True)
            r2 = await client.chat(USER, logprobs=True)
        body = srv.bodies()[0]
    assert body["logprobs"] is True and body["return_tokens_as_token_ids"] is True
    assert body["return_token_ids"] is True
    assert r.token_ids == [11, 22, 33] and r.logprobs == [-0.25, -1.5, 0.0]
    assert r.prompt_token_ids is not None and len(r.prompt_token_ids) == r.usage.prompt_tokens
    assert r2.token_ids is not None and len(r2.token_ids) == len(r2.logprobs) == r2.usage.completion_tokens


async def test_token_ids_from_token_id_strings_alone():
    # Only the "token_id:N" form in logprobs.content, no token_ids field (older vLLM).
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "ab"}, "finish_reason": "stop",
                                    "logprobs": {"content": [{"token": "token_id:5", "logprob": -0.5},
                                                             {"token": "token_id:900", "logprob": -2.0}]}}]})
    with ScriptedServer([ScriptedReply.malformed(body)]) as srv:
        async with _client(srv) as client:
            r = await client.chat(USER, logprobs=True)
    assert r.token_ids == [5, 900] and r.logprobs == [-0.5, -2.0]


async def test_plain_openai_server_gives_logprobs_but_no_token_ids():
    with ScriptedServer([ScriptedReply.say("one two three")]) as srv:
        async with _client(srv) as client:      # request_token_ids=False: no vLLM-only fields
            r = await client.chat(USER, logprobs=True)
        body = srv.bodies()[0]
    assert "return_tokens_as_token_ids" not in body and "return_token_ids" not in body
    assert r.token_ids is None and r.logprobs is not None and len(r.logprobs) == 3


async def test_server_without_token_data_leaves_both_none():
    with ScriptedServer([ScriptedReply.say("hi")], token_data=False) as srv:
        async with _client(srv, request_token_ids=True) as client:
            r = await client.chat(USER, logprobs=True)
    assert (r.token_ids, r.logprobs, r.prompt_token_ids) == (None, None, None)


async def test_token_ids_and_logprobs_of_different_length_are_refused():
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "ab"}, "finish_reason": "stop",
                                    "token_ids": [1, 2, 3],
                                    "logprobs": {"content": [{"token": "a", "logprob": -0.5}]}}]})
    with ScriptedServer([ScriptedReply.malformed(body)]) as srv:
        async with _client(srv) as client:
            with pytest.raises(LLMProtocolError, match="3 token ids but 1 logprobs"):
                await client.chat(USER, logprobs=True)


async def test_completion_with_token_prompt():
    reply = ScriptedReply.say(" world", token_ids=[7, 8], logprobs=[-0.1, -0.2])
    with ScriptedServer([reply, ScriptedReply.say("abc def ghi")]) as srv:
        async with _client(srv, request_token_ids=True) as client:
            r = await client.completion([101, 102, 103], max_tokens=8, logprobs=True, temperature=0.0)
            r2 = await client.completion("Hello", max_tokens=2)
        bodies = srv.bodies("/v1/completions")
    assert bodies[0]["prompt"] == [101, 102, 103] and bodies[0]["logprobs"] == 0
    assert (r.text, r.token_ids, r.logprobs, r.prompt_token_ids) == (" world", [7, 8], [-0.1, -0.2],
                                                                    [101, 102, 103])
    assert r.tool_calls == []
    assert (r2.text, r2.finish_reason) == ("abc def", "length")    # cut at max_tokens


async def test_http_errors_are_typed():
    script = [ScriptedReply.error(500), ScriptedReply.error(503, "overloaded"),
              ScriptedReply.error(429), ScriptedReply.error(400, "bad request")]
    with ScriptedServer(script) as srv:
        async with _client(srv) as client:
            errors = []
            for _ in script:
                with pytest.raises(LLMHTTPError) as info:
                    await client.chat(USER)
                errors.append(info.value)
        async with ChatClient(srv.url, "no-such-model", timeout_s=5) as stranger:
            with pytest.raises(LLMHTTPError) as wrong_model:
                await stranger.chat(USER)
    assert [(e.status, e.is_server_error, e.retryable) for e in errors] == [
        (500, True, True), (503, True, True), (429, False, True), (400, False, False)]
    assert "overloaded" in errors[1].body and isinstance(errors[0], TryloopError)
    assert wrong_model.value.status == 404 and not wrong_model.value.retryable
    assert "no-such-model" in wrong_model.value.body


async def test_timeout_is_typed_and_bounded():
    with ScriptedServer([ScriptedReply.hang(30)]) as srv:
        async with _client(srv, timeout_s=0.3) as client:
            start = time.monotonic()
            with pytest.raises(LLMTimeout) as info:
                await client.chat(USER)
            elapsed = time.monotonic() - start
    assert 0.25 < elapsed < 2.0
    assert info.value.retryable and info.value.timeout_s == 0.3


async def test_slow_server_latency_is_measured():
    with ScriptedServer(["slow"], latency_s=0.2) as srv:
        async with _client(srv) as client:
            r = await client.chat(USER)
    assert r.latency_s >= 0.2


async def test_malformed_bodies_are_protocol_errors():
    script = [ScriptedReply.malformed(),                                   # cut JSON
              ScriptedReply.malformed("[1, 2]"),                           # not an object
              ScriptedReply.malformed('{"error": {"message": "boom"}}'),  # 200 with no choices
              ScriptedReply.malformed(json.dumps({"choices": [{"message": {"content": "x"},
                                                               "logprobs": {"content": [{"logprob": "low"}]}}]}))]
    with ScriptedServer(script) as srv:
        async with _client(srv, max_retries=3, retry_backoff_s=0.01) as client:
            messages = []
            for _ in script:
                with pytest.raises(LLMProtocolError) as info:
                    await client.chat(USER, logprobs=True)
                messages.append(str(info.value))
        count = srv.request_count
    assert "not JSON" in messages[0] and "JSON list" in messages[1]
    assert "boom" in messages[2] and "logprobs.content[0].logprob" in messages[3]
    assert count == len(script)                  # a protocol error is not retried


async def test_connection_failures_are_typed():
    with ScriptedServer([ScriptedReply.disconnect()]) as srv:
        async with _client(srv) as client:
            with pytest.raises(LLMConnectionError):
                await client.chat(USER)
    with socket.socket() as s:                   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with ChatClient(f"http://127.0.0.1:{port}", "m", timeout_s=2) as client:
        with pytest.raises(LLMConnectionError) as info:
            await client.chat(USER)
        assert info.value.retryable
        assert await client.health() is False


async def test_retries_retryable_errors_then_succeeds():
    script = [ScriptedReply.error(503), ScriptedReply.error(500), ScriptedReply.hang(30), "finally"]
    with ScriptedServer(script) as srv:
        async with _client(srv, timeout_s=0.3, max_retries=3, retry_backoff_s=0.01) as client:
            r = await client.chat(USER)
        assert srv.request_count == 4
    assert (r.text, r.attempts) == ("finally", 4)


async def test_retries_stop_at_max_and_never_on_4xx():
    with ScriptedServer([ScriptedReply.error(502)] * 3 + [ScriptedReply.error(400), "unused"]) as srv:
        async with _client(srv, max_retries=2, retry_backoff_s=0.01) as client:
            with pytest.raises(LLMHTTPError) as gave_up:
                await client.chat(USER)
            with pytest.raises(LLMHTTPError) as bad:
                await client.chat(USER)
        assert srv.request_count == 4
    assert gave_up.value.status == 502 and bad.value.status == 400


async def test_models_health_metrics_and_api_key():
    with ScriptedServer([ScriptedReply.hang(30)], gpu_cache_usage=0.25) as srv:
        async with _client(srv, api_key="sk-test") as client:
            assert await client.models() == ["scripted-model"]
            assert await client.health() is True
            pending = asyncio.create_task(client.chat(USER))
            for _ in range(100):                 # until the hanging request is in progress
                metrics = await client.metrics()
                if metrics["vllm:num_requests_running"] == 1.0:
                    break
                await asyncio.sleep(0.02)
            pending.cancel()
        headers = srv.requests[0].headers
    assert metrics["vllm:num_requests_running"] == 1.0 and metrics["vllm:gpu_cache_usage_perc"] == 0.25
    assert headers.get("Authorization") == "Bearer sk-test"


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="base_url"):
        ChatClient("localhost:8000", "m")
    with pytest.raises(ValueError, match="timeout_s"):
        ChatClient("http://x", "m", timeout_s=0)
    client = ChatClient("http://127.0.0.1:1", "m")
    with pytest.raises(ValueError, match="extra may not set"):
        asyncio.run(client.chat(USER, extra={"messages": []}))
    with pytest.raises(ValueError, match="prompt"):
        asyncio.run(client.completion([]))


def test_client_survives_successive_event_loops():
    async def chat_and_maybe_close(client: ChatClient, close: bool) -> str:
        text = (await client.chat(USER)).text
        if close:
            await client.aclose()
        return text

    with ScriptedServer(["one", "two"]) as srv:
        client = _client(srv)
        assert asyncio.run(chat_and_maybe_close(client, False)) == "one"
        assert asyncio.run(chat_and_maybe_close(client, True)) == "two"   # a new loop, a new pool
    # The first loop's pool could not be closed from the second; collect it here, quietly.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


async def test_a_429_with_retry_after_is_retried_no_sooner_than_asked():
    import email.utils

    script = [ScriptedReply.error(429, headers={"Retry-After": "1"}), "served"]
    with ScriptedServer(script) as srv:
        async with _client(srv, max_retries=2, retry_backoff_s=0.01) as client:
            t0 = time.monotonic()
            r = await client.chat(USER)
            waited = time.monotonic() - t0
    assert r.text == "served" and r.attempts == 2
    assert waited >= 1.0, "the backoff (0.01 s) must not override the server's Retry-After"
    # The error carries what the server asked, as seconds, in both of the header's forms.
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    with ScriptedServer([ScriptedReply.error(503, headers={"Retry-After": later})]) as srv:
        async with _client(srv) as client:
            with pytest.raises(LLMHTTPError) as e:
                await client.chat(USER)
    assert 25 <= e.value.retry_after_s <= 31


def test_retry_delays_are_jittered_and_floored_by_retry_after():
    from tryloop.llm.client import parse_retry_after, retry_delay

    assert parse_retry_after("7") == 7.0 and parse_retry_after(None) is None
    assert parse_retry_after("soon") is None and parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    backoffs = [retry_delay(3, 0.5) for _ in range(200)]
    assert all(2.0 <= d <= 4.0 for d in backoffs) and len(set(backoffs)) > 150   # 0.5 * 2**3, jittered
    asked = [retry_delay(0, 0.5, 10.0) for _ in range(200)]
    assert all(10.0 <= d <= 12.0 for d in asked) and len(set(asked)) > 150
    assert retry_delay(0, 0.5, 10_000.0) <= 120.0 * 1.2    # a runaway Retry-After is capped


async def test_openai_policy_sends_the_key_from_the_named_environment_variable(monkeypatch):
    from tryloop.agent.config import PolicyConfig
    from tryloop.agent.policies import make_policy
    from tryloop.errors import ConfigError

    monkeypatch.setenv("TRYLOOP_TEST_KEY", "sk-from-env")
    with ScriptedServer(["hello"]) as srv:
        policy = make_policy(PolicyConfig(name="openai", base_url=srv.url, model=srv.model,
                                          api_key_env="TRYLOOP_TEST_KEY"))
        await policy.session("system", "do it").act(None)
        assert srv.requests[-1].headers.get("Authorization") == "Bearer sk-from-env"
        assert "sk-from-env" not in PolicyConfig(name="openai", api_key_env="TRYLOOP_TEST_KEY").model_dump_json()
    monkeypatch.delenv("TRYLOOP_TEST_KEY")
    with pytest.raises(ConfigError, match="policy.api_key_env.*TRYLOOP_TEST_KEY"):
        make_policy(PolicyConfig(name="openai", base_url="http://127.0.0.1:9", model="m",
                                 api_key_env="TRYLOOP_TEST_KEY"))
