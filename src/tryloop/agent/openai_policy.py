"""A policy behind any OpenAI-compatible server (vLLM, SGLang, llama.cpp server): chat with tools.

Tool calls come from the server's native `tool_calls`; a reply that writes a
call as text (<tool_call>{...}</tool_call>) is read too. Token data: when the
server returns the prompt's and the completion's token ids with logprobs (vLLM
with `return_token_ids`), each turn's new context ids are appended unmasked
and the completion's ids masked in — provided the server's prompt starts with
exactly the ids already logged. When it does not (or the server gives no ids),
the trajectory says `token_source = "unavailable"` rather than guess.
"""

from __future__ import annotations

import json
import time

from tryloop.agent.policy import Action, PolicyError, TokenLog
from tryloop.agent.tools import SCHEMAS
from tryloop.agent.trajectory import Observation, ToolCall
from tryloop.llm import ChatClient
from tryloop.llm.errors import LLMError

# Observations the episode adds that answer no call (see run_episode).
_NOTES = ("parse", "none")


class OpenAISession:
    def __init__(self, policy: OpenAIPolicy, system: str, instruction: str, seed: int,
                 tools: list[dict] | None = None):
        self.p = policy
        self.tools = tools if tools is not None else SCHEMAS   # the task environment's tools
        self.seed = seed
        self.tokens = TokenLog(source="server" if policy.token_ids else "unavailable")
        self.messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": instruction}]
        # The last reply's calls in order: (id, name, why it was not run: malformed arguments, or None).
        self._pending: list[tuple[str, str, str | None]] = []

    def _answer(self, observations: list[Observation]) -> None:
        """Each call of the last reply answered by its own id, then the episode's notes.

        The episode puts notes that answer no call first (a parse error, "no tool call
        found"); pairing by position would hand a call someone else's answer."""
        tied = iter([o for o in observations if o.name not in _NOTES])
        native_errors = False
        for call_id, name, problem in self._pending:
            if problem is not None:  # never run; a strict server wants every call id answered
                native_errors = True
                content = f"error: could not read your tool call: {problem}"
                self.messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": content})
                continue
            obs = next(tied, None)
            if obs is None:
                break
            self.messages.append({"role": "tool", "tool_call_id": call_id, "name": obs.name, "content": obs.content})
        for obs in observations:
            # The parse note repeats the errors just answered by id when they were native calls.
            if obs.name in _NOTES and not (obs.name == "parse" and native_errors):
                self.messages.append({"role": "user", "content": obs.content})
        for obs in tied:  # more answers than calls: keep them visible rather than drop them
            self.messages.append({"role": "user", "content": obs.content})

    async def act(self, observations: list[Observation] | None) -> Action:
        self._answer(observations or [])
        t0 = time.perf_counter()
        try:
            res = await self.p.client.chat(self.messages, tools=self.tools, temperature=self.p.temperature,
                                           max_tokens=self.p.max_tokens, logprobs=self.p.token_ids,
                                           seed=self.seed)
        except LLMError as e:
            raise PolicyError(f"inference failed: {e}", retryable=e.retryable) from e
        calls, errors, pending = [], [], []
        ids = [c.id or f"call_{len(self.messages)}_{i}" for i, c in enumerate(res.tool_calls)]
        for call_id, c in zip(ids, res.tool_calls, strict=True):
            if c.parse_error or not isinstance(c.arguments, dict):
                problem = f"{c.name}: {c.parse_error or 'arguments are not a JSON object'}"
                errors.append(problem)
                pending.append((call_id, c.name, problem))
            else:
                calls.append(ToolCall(c.name, c.arguments, call_id))
                pending.append((call_id, c.name, None))
        if not res.tool_calls:
            from tryloop.agent.chat import parse_tool_calls

            parsed = parse_tool_calls(res.text, shell_tool="shell")
            calls = [ToolCall(c.name, c.arguments, c.id or f"call_{len(self.messages)}_{i}")
                     for i, c in enumerate(parsed.calls)]
            errors += [e.message for e in parsed.errors]
            pending = [(c.id, c.name, None) for c in calls]
        self._log_tokens(res)
        msg: dict = {"role": "assistant", "content": res.text}
        if res.tool_calls:
            msg["tool_calls"] = [{"id": call_id, "type": "function", "function": {
                "name": c.name, "arguments": json.dumps(c.arguments) if isinstance(c.arguments, dict) else c.arguments}}
                for call_id, c in zip(ids, res.tool_calls, strict=True)]
        self.messages.append(msg)
        self._pending = pending
        return Action(res.text, calls, "; ".join(errors) or None, res.finish_reason or "stop",
                      completion_tokens=(res.usage.completion_tokens if res.usage else 0),
                      model_s=time.perf_counter() - t0)

    def _log_tokens(self, res) -> None:
        log = self.tokens
        if log.source == "unavailable":
            return
        prompt, ids, lps = res.prompt_token_ids, res.token_ids, res.logprobs
        if prompt is None or ids is None or lps is None or prompt[: len(log.ids)] != log.ids:
            log.source = "unavailable"  # cannot vouch for exactness any more
            return
        log.add_context(list(prompt[len(log.ids):]))
        log.add_sampled(list(ids), list(lps))


class OpenAIPolicy:
    def __init__(self, base_url: str, model: str, *, temperature: float = 0.7, max_tokens: int = 512,
                 token_ids: bool = False, timeout_s: float = 300.0, api_key: str | None = None,
                 max_retries: int = 0):
        self.client = ChatClient(base_url, model, api_key, timeout_s=timeout_s, request_token_ids=token_ids,
                                 max_retries=max_retries)
        self.name = f"openai:{model}"
        self.version = model
        self.temperature, self.max_tokens, self.token_ids = temperature, max_tokens, token_ids

    def session(self, system: str, instruction: str, *, seed: int = 0, task=None) -> OpenAISession:
        from tryloop.agent.profiles import profile_for

        return OpenAISession(self, system, instruction, seed, tools=profile_for(task).schemas)

    async def aclose(self) -> None:
        await self.client.aclose()
