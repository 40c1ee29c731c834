"""The OpenAI-compatible server over the engine, spoken to over real HTTP (httpx and our ChatClient)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tryloop.agent.chat import ChatTokenizer
from tryloop.agent.engine import Engine
from tryloop.agent.serve import OpenAIServer
from tryloop.llm import ChatClient

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def engine(smollm2, one_thread):
    with Engine(smollm2.model, smollm2.tokenizer, weights_version=smollm2.weights_version) as eng:
        yield eng


@pytest.fixture
async def server(engine):
    async with OpenAIServer(engine, model_name="smollm2-135m", default_max_tokens=8) as srv:
        yield srv


async def test_health_models_and_metrics(server, smollm2):
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/health")).status_code == 200
        models = (await http.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["smollm2-135m"]
        assert models["data"][0]["weights_version"] == smollm2.weights_version
        metrics = (await http.get("/metrics")).text
        assert 'vllm:num_requests_running{model_name="smollm2-135m"} 0' in metrics
    async with ChatClient(server.url, "smollm2-135m") as client:
        assert await client.models() == ["smollm2-135m"] and await client.health()


async def test_completion_from_token_ids_is_token_exact(server, engine, smollm2):
    chat = ChatTokenizer(smollm2.tokenizer)
    prompt = chat.start(MESSAGES)
    direct = await engine.generate(prompt, max_new_tokens=6, temperature=0)
    async with ChatClient(server.url, "smollm2-135m", request_token_ids=True) as client:
        r = await client.completion(prompt, temperature=0, max_tokens=6, logprobs=True)
    assert r.token_ids == direct.token_ids and r.prompt_token_ids == prompt
    assert r.logprobs == pytest.approx(direct.policy_logprobs, abs=1e-4)
    assert r.raw["choices"][0]["logprobs"]["tokens"][0] == f"token_id:{direct.token_ids[0]}"
    assert r.text == smollm2.tokenizer.decode(direct.token_ids, skip_special_tokens=True)
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == 6


async def test_chat_completion_with_our_client(server, engine, smollm2):
    chat = ChatTokenizer(smollm2.tokenizer)
    direct = await engine.generate(chat.start(MESSAGES), max_new_tokens=20, temperature=0)
    assert direct.finish_reason == "stop"                     # ends with <|im_end|>
    async with ChatClient(server.url, "smollm2-135m", request_token_ids=True) as client:
        r = await client.chat(MESSAGES, temperature=0, max_tokens=20, logprobs=True)
    assert r.token_ids == direct.token_ids                    # the stop token included
    assert r.text == smollm2.tokenizer.decode(direct.token_ids[:-1])   # and not in the text
    assert r.finish_reason == "stop" and r.prompt_token_ids == chat.start(MESSAGES)
    assert len(r.logprobs) == len(r.token_ids)


async def test_sampling_options_and_n(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        body = {"model": "smollm2-135m", "messages": MESSAGES, "n": 2, "seed": 1,
                "temperature": 1.0, "max_tokens": 4, "logprobs": True, "return_token_ids": True}
        r = (await http.post("/v1/chat/completions", json=body)).json()
        assert [c["index"] for c in r["choices"]] == [0, 1]
        again = (await http.post("/v1/chat/completions", json=body)).json()
        assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in r["choices"]]
        text = (await http.post("/v1/completions", json={
            "prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0, "logprobs": 0})).json()
        assert text["object"] == "text_completion" and len(text["choices"][0]["logprobs"]["tokens"]) == 3


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("POST", "/v1/chat/completions", {"model": "gpt-4", "messages": MESSAGES}, 404),
    ("POST", "/v1/chat/completions", {"messages": MESSAGES, "stream": True}, 400),
    ("POST", "/v1/chat/completions", {"messages": []}, 400),
    ("POST", "/v1/chat/completions", {"messages": MESSAGES, "temperature": "hot"}, 400),
    ("POST", "/v1/completions", {"prompt": []}, 400),
    ("POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 0}, 400),
    ("POST", "/v1/completions", "not json", 400),
    ("GET", "/v1/chat/completions", None, 405),
    ("GET", "/nowhere", None, 404),
])
async def test_bad_requests_get_openai_errors(server, method, path, body, status):
    async with httpx.AsyncClient(base_url=server.url) as http:
        content = body if isinstance(body, str) else (json.dumps(body) if body is not None else None)
        r = await http.request(method, path, content=content)
    assert r.status_code == status
    assert r.json()["error"]["message"]


async def test_a_client_that_hangs_up_cancels_its_generation(server, engine):
    before = engine.stats().requests_done
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2000, "temperature": 0,
                       "stop_token_ids": []}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    while engine.stats().active == 0:
        await asyncio.sleep(0.02)
    writer.close()
    for _ in range(200):
        if engine.stats().active == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.stats().active == 0 and engine.stats().requests_done == before
