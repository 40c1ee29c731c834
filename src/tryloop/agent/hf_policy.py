"""A local Hugging Face model as the policy: token-exact sessions over the batching engine.

Each session keeps the episode's token log itself: the chat-templated prompt,
then per turn the sampled ids exactly as the engine returned them (masked in,
with their raw-policy log-probabilities at temperature 1 — what a trainer
recomputes), then the template's ids for the tool results (masked out). Text
is decoded from the ids for tool-call parsing, never encoded back.
Concurrent sessions share one engine, so their turns are decoded in one batch.
"""

from __future__ import annotations

import time
from typing import Any

from tryloop.agent.chat import ChatTokenizer, parse_tool_calls
from tryloop.agent.policy import Action, ContextFull, PolicyError, TokenLog
from tryloop.agent.tools import TOOL_NAMES
from tryloop.agent.trajectory import Observation
from tryloop.errors import TryloopError


class HFSession:
    def __init__(self, policy: HFPolicy, system: str, instruction: str, seed: int,
                 stop_strings: tuple[str, ...] = (), tool_names: list[str] | None = None):
        self.p = policy
        self.tool_names = tool_names or TOOL_NAMES   # the task environment's tools
        self.seed = seed
        self.stop_strings = stop_strings
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                               {"role": "user", "content": instruction}]
        self.tokens = TokenLog(source="exact")
        self.tokens.add_context(policy.chat.start(self.messages))
        self._turn = 0

    async def act(self, observations: list[Observation] | None) -> Action:
        chat = self.p.chat
        if observations:
            new = [chat.tool_message(o.name, o.content) for o in observations]
            self.messages += new
            self.tokens.add_context(chat.append_observation(self.tokens.ids, new))
        room = self.p.max_context - len(self.tokens.ids)
        if room < 16:
            raise ContextFull(f"{len(self.tokens.ids)} tokens leave no room in the {self.p.max_context}-token context")
        t0 = time.perf_counter()
        try:
            sample = await self.p.engine.generate(
                self.tokens.ids, max_new_tokens=min(self.p.max_new_tokens, room), temperature=self.p.temperature,
                top_p=self.p.top_p, seed=self.seed * 7919 + self._turn, stop_strings=self.stop_strings)
        except TryloopError as e:
            raise PolicyError(f"generation failed: {e}") from e
        self._turn += 1
        # Raw-policy log-probs (T=1, full vocabulary), whatever the sampling temperature. They are
        # pi_old only at T=1 and top_p 1: otherwise the learner recomputes pi_old at the sampling
        # temperature (train.algo.old_logprobs "sampler" is refused there).
        self.tokens.add_sampled(sample.token_ids, sample.policy_logprobs)
        text = self.p.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": text})
        parsed = parse_tool_calls(text, shell_tool="shell", known_tools=self.tool_names)
        for i, c in enumerate(parsed.calls):
            c.id = f"call_{self._turn}_{i}"
        return Action(text, parsed.calls, "; ".join(e.message for e in parsed.errors) or None,
                      sample.finish_reason, len(sample.token_ids), time.perf_counter() - t0,
                      weights_versions=tuple(sample.weights_versions))


class HFPolicy:
    """`HFPolicy.load("smollm2-135m")`; the engine batches the turns of all open sessions."""

    def __init__(self, loaded: Any, *, temperature: float = 0.7, top_p: float = 1.0, max_new_tokens: int = 384,
                 max_context: int = 8192, max_batch: int = 16, num_threads: int | None = None,
                 dtype: str | Any = "float32", engine: Any = None, multi_turn: bool = True,
                 cpu_kernels: bool = True):
        """`dtype`: the engine's ("float32" | "bfloat16" | "auto", see PolicyConfig.dtype); the
        engine casts `loaded.model` to it in place (it owns the model). `engine`: another sampler
        with the engine's `generate` (an `EndpointSampler`: model servers); then only
        `loaded.tokenizer` is used here, and the sessions are token-exact the same way.
        `multi_turn` False: every session ends after one turn (limits.max_turns 1), so the engine
        keeps no finished turn for a next one, and its prefix cache only the prompts a full batch
        can share. `cpu_kernels`: see `Engine`."""
        from tryloop.agent.engine import DEFAULT_PREFIX_CACHE_MB, Engine
        from tryloop.agent.hf import resolve_engine_dtype

        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.chat = ChatTokenizer(loaded.tokenizer)
        if engine is None:
            engine_dtype = resolve_engine_dtype(dtype, loaded.device)
            # Single-turn, prompts are reused only by requests still to come for the same group,
            # a batch's worth at most: more entries would be prompts nothing reads again, kept
            # (LRU evicts only when full) beside the learner's weights and optimizer state. A
            # bound in bytes cannot say this: prompts are far shorter than the context.
            engine = Engine(loaded.model, loaded.tokenizer, max_batch=max_batch,
                            weights_version=loaded.weights_version, num_threads=num_threads,
                            dtype=engine_dtype, prefix_cache_mb=DEFAULT_PREFIX_CACHE_MB,
                            prefix_cache_entries=None if multi_turn else max_batch,
                            cache_completions=multi_turn,
                            cpu_kernels=cpu_kernels)
        self.engine = engine
        self.name = loaded.name
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens = max_new_tokens
        self.max_context = min(max_context, self.engine.max_context)

    @property
    def version(self) -> str:
        return self.engine.weights_version

    @classmethod
    def load(cls, name: str = "smollm2-135m", *, device: str = "auto", **kw: Any) -> HFPolicy:
        from tryloop.agent.hf import load_model

        return cls(load_model(name, device=device), **kw)

    def session(self, system: str, instruction: str, *, seed: int = 0, task=None) -> HFSession:
        # A function-level task's answer is one code block: generation stops at the block's closing
        # fence (an opening fence names its language, so "\n```\n" closes a block). What follows a
        # finished answer is never read, and sampling it would cost most of a turn.
        answer = task is not None and getattr(task.meta, "answer_file", None)
        from tryloop.agent.profiles import profile_for

        return HFSession(self, system, instruction, seed, stop_strings=("\n```\n",) if answer else (),
                         tool_names=list(profile_for(task).tools))

    def close(self) -> None:
        self.engine.close()
