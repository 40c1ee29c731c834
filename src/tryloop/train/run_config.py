"""`train:` in the YAML file: the run around the algorithm (TrainConfig)."""

from __future__ import annotations

from pydantic import Field

from tryloop._model import _Model
from tryloop.agent.config import EpisodeLimits, PolicyConfig
from tryloop.train.config import TrainConfig


def _limits() -> EpisodeLimits:
    # Function-level tasks answered in one or two turns: what a 135M model on a CPU can do.
    return EpisodeLimits(max_turns=2, max_new_tokens=256, max_total_tokens=512, max_context_tokens=2048)


class TrainRunConfig(_Model):
    # micro_batch 2 and no entropy logging: full-vocabulary log-softmax over ~1k-token sequences is
    # the memory peak of a CPU step (4 sequences with entropy went past 24 GB).
    algo: TrainConfig = Field(default_factory=lambda: TrainConfig(lr=2e-6, micro_batch=2, max_length=2048,
                                                                  log_entropy=False),
                              description="advantages, loss and optimizer")
    policy: PolicyConfig = Field(default_factory=lambda: PolicyConfig(temperature=1.0),
                                 description="the local model trained (sampled at T=1: on-policy log-probs)")
    limits: EpisodeLimits = Field(default_factory=_limits)
    source: str | None = Field("humaneval", description="train tasks of this source only (None: all)")
    steps: int = Field(8, ge=1, description="optimizer steps (one per rollout batch)")
    tasks_per_step: int = Field(4, ge=1, description="groups per step")
    group_size: int = Field(4, ge=2, description="episodes per task per step")
    concurrency: int = Field(8, ge=1, description="episodes at once")
    window: int = Field(8, ge=1, description="curriculum: recent results per task")
    explore: float = Field(0.25, ge=0, le=1, description="curriculum: share drawn outside the learning zone")
    eval_every: int = Field(4, ge=1, description="held-out evaluation every N steps (and at the end)")
    eval_tasks: int = Field(16, ge=0, description="held-out tasks per evaluation (0: no evaluation)")
    eval_k: int = Field(1, ge=1, description="samples per held-out task")
    eval_temperature: float = Field(0.0, ge=0, description="sampling temperature of evaluations (0 = greedy)")
    eval_at_start: bool = Field(True, description="evaluate before the first step (the baseline)")
    keep_checkpoints: int = Field(2, ge=1)
    run_id: str = Field("train", description="runs_dir/<run_id> holds checkpoints, metrics and the report")
    seed: int = 0
