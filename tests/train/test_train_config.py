"""TrainConfig: strict, frozen, loadable from a plain mapping (YAML)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tryloop.config import parse
from tryloop.errors import ConfigError
from tryloop.train.config import TrainConfig


def test_defaults():
    c = TrainConfig()
    assert (c.estimator, c.aggregation, c.gspo, c.kl_coef, c.lora) == ("grpo", "token_mean", False, 0.0, False)
    assert c.eps_high > c.eps_low  # clip-higher by default
    assert c.mask_terminations == {"context_full", "timeout", "error"}
    assert all(f.description for name, f in TrainConfig.model_fields.items()), "every field says what it is"


def test_strict_and_frozen():
    with pytest.raises(ValidationError):
        TrainConfig(estimatr="grpo")
    with pytest.raises(ValidationError):
        TrainConfig(estimator="ppo")
    with pytest.raises(ValidationError):
        TrainConfig(flag_policy={"hack": "explode"})
    with pytest.raises(ValidationError):
        TrainConfig().lr = 1.0


def test_from_mapping():
    c = parse(TrainConfig, {"estimator": "rloo", "mask_terminations": ["error"], "lora": True,
                            "lora_targets": ["q_proj"], "flag_policy": {"constant_eq": "mask"}})
    assert c.mask_terminations == frozenset({"error"}) and c.lora_targets == ("q_proj",)
    with pytest.raises(ConfigError, match="aggregation"):
        parse(TrainConfig, {"aggregation": "sum"})
