"""What a model server answered, parsed out of the OpenAI response shapes.

Token-level data is kept only when the server really offers it (docs/architecture.md,
invariant 6): `token_ids` from an explicit `token_ids` field (vLLM's
`return_token_ids`) or from vLLM's `return_tokens_as_token_ids` form
`"token_id:123"` in the logprobs; `logprobs` from the per-token entries. When
the server gives neither, the field is None and the caller records the
trajectory's tokens as "unavailable" — nothing here re-tokenizes text.

A model's malformed tool-call arguments are the model's mistake, not the
server's: they are kept as the raw string with `parse_error` set, never raised.
A response that is not the OpenAI shape is the server's fault and raises
`LLMProtocolError` naming the field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from tryloop.llm.errors import LLMProtocolError

_TOKEN_ID_RE = re.compile(r"token_id:(\d+)")


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    id: str                               # "" when the server sent none
    name: str
    arguments: dict[str, Any] | str       # str only when parse_error is set: the raw text
    parse_error: str | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class ChatResult:
    """One choice of a chat or completion response (tool_calls is always empty for completions)."""

    text: str
    tool_calls: list[ParsedToolCall]
    finish_reason: str                    # "stop", "length", "tool_calls", ...; "" when absent
    usage: Usage | None
    token_ids: list[int] | None           # sampled tokens; None: the server did not say
    logprobs: list[float] | None          # their log-probabilities; None: the server did not say
    prompt_token_ids: list[int] | None = None
    reasoning: str | None = None          # vLLM's reasoning_content, when a reasoning parser is on
    model: str = ""
    latency_s: float = 0.0
    attempts: int = 1                     # 1 + retries it took
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def parse_chat(data: dict[str, Any]) -> ChatResult:
    choice = _first_choice(data)
    message = choice.get("message")
    if not isinstance(message, dict):
        raise LLMProtocolError(f"choices[0].message is {type(message).__name__}, expected an object")
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    logprobs = _chat_logprobs(choice.get("logprobs"))
    return _result(
        data, choice,
        text=_content_text(message.get("content")),
        tool_calls=_tool_calls(message.get("tool_calls")),
        logprob_tokens=logprobs,
        reasoning=reasoning if isinstance(reasoning, str) else None,
    )


def parse_completion(data: dict[str, Any]) -> ChatResult:
    choice = _first_choice(data)
    text = choice.get("text")
    if not isinstance(text, str):
        raise LLMProtocolError(f"choices[0].text is {type(text).__name__}, expected a string")
    return _result(data, choice, text=text, tool_calls=[],
                   logprob_tokens=_completion_logprobs(choice.get("logprobs")), reasoning=None)


def _result(data: dict[str, Any], choice: dict[str, Any], *, text: str,
            tool_calls: list[ParsedToolCall],
            logprob_tokens: tuple[list[str], list[float]] | None,
            reasoning: str | None) -> ChatResult:
    logprobs: list[float] | None = None
    token_ids = _int_list(choice.get("token_ids"), "choices[0].token_ids")
    if logprob_tokens is not None:
        tokens, logprobs = logprob_tokens
        if token_ids is None:
            token_ids = _ids_from_token_strings(tokens)
    if token_ids is not None and logprobs is not None and len(token_ids) != len(logprobs):
        # Mismatched arrays would silently misalign logprobs with tokens in training.
        raise LLMProtocolError(f"choices[0]: {len(token_ids)} token ids but {len(logprobs)} logprobs")
    prompt_ids = _int_list(choice.get("prompt_token_ids"), "choices[0].prompt_token_ids")
    if prompt_ids is None:
        prompt_ids = _int_list(data.get("prompt_token_ids"), "prompt_token_ids")
    finish = choice.get("finish_reason")
    model = data.get("model")
    return ChatResult(
        text=text, tool_calls=tool_calls,
        finish_reason=finish if isinstance(finish, str) else "",
        usage=_usage(data.get("usage")),
        token_ids=token_ids, logprobs=logprobs, prompt_token_ids=prompt_ids,
        reasoning=reasoning, model=model if isinstance(model, str) else "", raw=data,
    )


def _first_choice(data: dict[str, Any]) -> dict[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        err = data.get("error")
        hint = f" (server said: {str(err)[:300]})" if err else ""
        raise LLMProtocolError(f"response has no choices list{hint}")
    if not isinstance(choices[0], dict):
        raise LLMProtocolError(f"choices[0] is {type(choices[0]).__name__}, expected an object")
    return choices[0]


def _content_text(content: Any) -> str:
    if content is None:
        return ""                      # a pure tool-call message has null content
    if isinstance(content, str):
        return content
    if isinstance(content, list):      # content parts: [{"type": "text", "text": ...}, ...]
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
                raise LLMProtocolError(f"choices[0].message.content[{i}] is not a text part")
            parts.append(part.get("text", ""))
        return "".join(parts)
    raise LLMProtocolError(f"choices[0].message.content is {type(content).__name__}")


def _tool_calls(raw: Any) -> list[ParsedToolCall]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise LLMProtocolError(f"choices[0].message.tool_calls is {type(raw).__name__}, expected a list")
    calls = []
    for i, tc in enumerate(raw):
        where = f"choices[0].message.tool_calls[{i}]"
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict):
            raise LLMProtocolError(f"{where}.function is missing or not an object")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise LLMProtocolError(f"{where}.function.name is missing or not a string")
        args, error = _arguments(fn.get("arguments"))
        call_id = tc.get("id")
        calls.append(ParsedToolCall(id=call_id if isinstance(call_id, str) else "",
                                    name=name, arguments=args, parse_error=error))
    return calls


def _arguments(raw: Any) -> tuple[dict[str, Any] | str, str | None]:
    if isinstance(raw, dict):          # some servers send the object itself
        return raw, None
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None                # a call without arguments
    if not isinstance(raw, str):
        return json.dumps(raw), f"arguments are a JSON {type(raw).__name__}, not an object"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        return raw, f"arguments are not valid JSON: {e}"
    if not isinstance(value, dict):
        return raw, f"arguments are a JSON {type(value).__name__}, not an object"
    return value, None


def _chat_logprobs(raw: Any) -> tuple[list[str], list[float]] | None:
    """Chat shape: {"content": [{"token": str, "logprob": float, ...}, ...]}."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise LLMProtocolError(f"choices[0].logprobs is {type(raw).__name__}, expected an object")
    content = raw.get("content")
    if content is None:
        return None
    if not isinstance(content, list):
        raise LLMProtocolError("choices[0].logprobs.content is not a list")
    tokens, logprobs = [], []
    for i, entry in enumerate(content):
        where = f"choices[0].logprobs.content[{i}]"
        if not isinstance(entry, dict):
            raise LLMProtocolError(f"{where} is not an object")
        tokens.append(entry.get("token") if isinstance(entry.get("token"), str) else "")
        logprobs.append(_logprob(entry.get("logprob"), f"{where}.logprob"))
    return tokens, logprobs


def _completion_logprobs(raw: Any) -> tuple[list[str], list[float]] | None:
    """Legacy completions shape: {"tokens": [str], "token_logprobs": [float], ...}."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise LLMProtocolError(f"choices[0].logprobs is {type(raw).__name__}, expected an object")
    tokens, values = raw.get("tokens"), raw.get("token_logprobs")
    if tokens is None and values is None:
        return None
    if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
        raise LLMProtocolError("choices[0].logprobs.tokens / token_logprobs are not lists of equal length")
    logprobs = [_logprob(v, f"choices[0].logprobs.token_logprobs[{i}]") for i, v in enumerate(values)]
    return [t if isinstance(t, str) else "" for t in tokens], logprobs


def _logprob(value: Any, where: str) -> float:
    # A log-probability is <= 0; a hair above 0 is float rounding of log(1), not a bad server.
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value > 1e-3:
        raise LLMProtocolError(f"{where} is {value!r}, expected a number <= 0")
    return float(value)


def _ids_from_token_strings(tokens: list[str]) -> list[int] | None:
    """vLLM's return_tokens_as_token_ids form; None unless every token has it (no half answers)."""
    ids = []
    for token in tokens:
        m = _TOKEN_ID_RE.fullmatch(token)
        if m is None:
            return None
        ids.append(int(m.group(1)))
    return ids


def _int_list(raw: Any, where: str) -> list[int] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                            for x in raw):
        raise LLMProtocolError(f"{where} is not a list of non-negative integers")
    return list(raw)


def _usage(raw: Any) -> Usage | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise LLMProtocolError(f"usage is {type(raw).__name__}, expected an object")
    values = {}
    for key in ("prompt_tokens", "completion_tokens"):
        v = raw.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise LLMProtocolError(f"usage.{key} is {v!r}, expected a non-negative integer")
        values[key] = v
    return Usage(**values)
