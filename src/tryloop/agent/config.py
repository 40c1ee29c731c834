"""Configuration of policies and episodes (`eval.policy`, `eval.limits`, `train.policy`, ...)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tryloop._model import _Model

#: The devices a local model runs on: auto (a GPU where torch sees one, else the CPU), cpu, cuda[:N].
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"


class EpisodeLimits(_Model):
    max_turns: int = Field(12, ge=1, description="actions before the episode ends with turn_limit")
    max_new_tokens: int = Field(384, ge=1, description="tokens the policy may sample per turn")
    max_context_tokens: int = Field(8192, ge=256, description="prompt + history + next turn must fit")
    max_total_tokens: int = Field(4096, ge=1, description="sampled tokens over the whole episode")
    wall_time_s: float = Field(600.0, gt=0, description="the episode's wall-clock budget (verification excluded)")
    turn_timeout_s: float = Field(300.0, gt=0, description="one model call")
    shell_timeout_s: float = Field(60.0, gt=0, description="one shell command")
    output_chars: int = Field(4000, ge=200, description="tool output shown to the model per call")


class PolicyConfig(_Model):
    """Which policy acts. `name`: a local model ("smollm2-135m", a directory, a hub id), "openai"
    (any OpenAI-compatible server at `base_url`), or a scripted one: oracle, do-nothing, random,
    hacker:<attack>."""

    name: str = Field("smollm2-135m", description="local model, 'openai', or a scripted policy")
    base_url: str | None = Field(None, description="OpenAI-compatible server (name: openai)")
    model: str | None = Field(None, description="model name on the server (name: openai)")
    temperature: float = Field(0.7, ge=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1)
    max_batch: int = Field(16, ge=1, description="local model: sequences decoded together")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                    description="openai: the environment variable holding the API key, sent "
                                                "as a bearer token (the key never enters the config or a "
                                                "record); null: no key, as local servers expect")
    max_retries: int = Field(3, ge=0, description="openai: retries of a failed call (timeouts, 5xx, 408, 429), "
                                                  "after a jittered backoff or the server's Retry-After")
    token_ids: bool = Field(False, description="openai: ask the server for token ids and logprobs (vLLM's "
                                               "return_token_ids); plain OpenAI servers reject the field")
    device: str = Field("auto", pattern=DEVICE_PATTERN, description="local model: auto | cpu | cuda | cuda:N")
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32", description="local model: the generation engine's dtype. bfloat16 is ~1.6x faster "
                               "on a CPU with AMX/AVX512-BF16 or a GPU, but its log-probabilities differ from "
                               "the float32 learner's by ~1e-2 (seen as off-policyness by the loss's ratio); "
                               "auto = bfloat16 where the device has fast bf16, else float32")
    cpu_kernels: bool = Field(True, description="local model on a CPU: decode steps attend over the KV buffers directly "
                                                "(a C loop built with the host's compiler; without one, torch matmuls for "
                                                "bfloat16 models and transformers' own attention for float32 ones) and "
                                                "bfloat16 models multiply by weights packed once for oneDNN (bit-identical "
                                                "products); 1.65-1.86x faster bf16 decoding, 1.05-1.14x float32, at 1-32 "
                                                "sequences here; false: transformers' own attention and matmuls")
