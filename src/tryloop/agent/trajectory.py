"""What one episode leaves behind: the exact tokens, the turns, the verdict.

Token-in, token-out (docs/architecture.md, invariant 6): `token_ids` is the whole
sequence the policy saw and produced, in order; `loss_mask[i] == 1` exactly
for tokens the policy sampled, with their sampling log-probability in
`logprobs[i]` (0.0 elsewhere). Tool output and chat-template tokens are never
masked in, and nothing is re-tokenized after the fact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Termination = Literal["submitted", "turn_limit", "context_full", "timeout", "error"]
# Where token ids / logprobs came from: our own sampler ("exact"), an
# OpenAI-compatible server that returned them ("server"), or nowhere ("unavailable":
# the trajectory can be evaluated and exported as chat, not trained on token-exact).
TokenSource = Literal["exact", "server", "unavailable"]


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class Observation:
    """A tool's answer to one call, as the policy will see it."""

    name: str
    content: str
    ok: bool = True                 # False: the call was malformed / unknown / failed
    truncated: bool = False
    exit_code: int | None = None    # for shell commands
    env_s: float = 0.0


@dataclass
class Turn:
    index: int
    text: str                                        # what the policy produced, decoded
    tool_calls: list[ToolCall] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    completion_tokens: int = 0
    model_s: float = 0.0                             # time in the model
    env_s: float = 0.0                               # time in the environment (tools)
    finish_reason: str = ""                          # "stop", "length", ...
    weights_versions: list[str] = field(default_factory=list)  # every version that sampled a token of it


@dataclass
class Trajectory:
    episode_id: str
    task_id: str
    task_fingerprint: str = ""
    run_id: str = ""
    step: int = 0
    group_id: str = ""                               # the episodes of one task in one step
    sample_index: int = 0
    policy: str = ""                                 # policy / model name
    policy_version: str = ""                         # weights version when the episode started
    # Every weights version that sampled a token of it, in order (its turns'; empty for a policy
    # that does not report them). The trainer refuses an episode holding a version it did not push.
    weights_versions: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # chat transcript
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    prompt_length: int = 0                           # tokens before the policy's first sample
    token_source: TokenSource = "exact"
    turns: list[Turn] = field(default_factory=list)
    # The final workspace diff the verifier judged: path -> base64 bytes, None = deleted
    # (tryloop.rewards.verifier.encode_changes). Kept so a new reward version can re-score it.
    changes: dict[str, str | None] = field(default_factory=dict)
    termination: Termination = "error"
    error: str = ""
    # Filled by the verifier (tryloop.rewards.Verdict, flattened for storage).
    verdict: str | None = None                       # "pass" | "fail" | "no_verdict"
    reward: float | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    flags: list[dict[str, Any]] = field(default_factory=list)
    reward_version: str = ""
    verdict_reason: str = ""
    # Seconds: model, env, verify, total.
    times: dict[str, float] = field(default_factory=dict)
    created_at: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def completion_tokens(self) -> int:
        return sum(self.loss_mask)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        turns = []
        for t in d.pop("turns", []) or []:
            t = dict(t)
            t["tool_calls"] = [ToolCall(**c) for c in t.get("tool_calls", []) or []]
            t["observations"] = [Observation(**o) for o in t.get("observations", []) or []]
            turns.append(Turn(**t))
        known = {f for f in cls.__dataclass_fields__}
        return cls(turns=turns, **{k: v for k, v in d.items() if k in known})
