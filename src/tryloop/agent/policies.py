"""Build a policy from configuration: a local model, an OpenAI-compatible server, or a script."""

from __future__ import annotations

import os

from tryloop.agent.config import EpisodeLimits, PolicyConfig
from tryloop.errors import ConfigError

SCRIPTED = ("oracle", "do-nothing", "random")


def make_policy(cfg: PolicyConfig, limits: EpisodeLimits | None = None):
    limits = limits or EpisodeLimits()
    name = cfg.name
    if name in SCRIPTED or name.startswith("hacker:"):
        from tryloop.agent import scripted

        if name.startswith("hacker:"):
            try:
                return scripted.Hacker(name.split(":", 1)[1])
            except ValueError as e:
                raise ConfigError(f"policy.name: {e}") from None
        return {"oracle": scripted.Oracle, "do-nothing": scripted.DoNothing, "random": scripted.RandomPolicy}[name]()
    if name == "openai":
        from tryloop.agent.openai_policy import OpenAIPolicy

        if not cfg.base_url or not cfg.model:
            raise ConfigError("policy.name is 'openai': set policy.base_url and policy.model")
        key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        if cfg.api_key_env and not key:
            raise ConfigError(f"policy.api_key_env: the environment variable {cfg.api_key_env} is not set")
        return OpenAIPolicy(cfg.base_url, cfg.model, temperature=cfg.temperature, token_ids=cfg.token_ids,
                            max_tokens=limits.max_new_tokens, timeout_s=limits.turn_timeout_s,
                            api_key=key, max_retries=cfg.max_retries)
    from tryloop.agent.hf_policy import HFPolicy

    return HFPolicy.load(name, device=cfg.device, temperature=cfg.temperature, top_p=cfg.top_p,
                         max_new_tokens=limits.max_new_tokens, max_context=limits.max_context_tokens,
                         max_batch=cfg.max_batch, dtype=cfg.dtype, cpu_kernels=cfg.cpu_kernels,
                         multi_turn=limits.max_turns > 1)
