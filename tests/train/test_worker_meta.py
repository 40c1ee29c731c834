"""What a trainer on Ray tells its rollout workers to sample with, for evaluations and the zone
measurement as for training episodes."""

from __future__ import annotations

from types import SimpleNamespace

from tryloop.agent.endpoints import EndpointSampler
from tryloop.train.run import _set_meta


def test_evaluation_episodes_on_ray_sample_only_from_endpoints_the_last_push_reached():
    """A worker's sampler never pushes, so it cannot tell an endpoint that missed a push from one
    that took it: the trainer names the ones that took it (`meta.endpoints`). Without that an
    evaluation's completions could come from older weights (vLLM / SGLang report no version)."""
    trainer = EndpointSampler(["http://a:1", "http://b:1"])
    trainer.announced = trainer.endpoints[0].version = "step-0"
    trainer.endpoints[1].version = "initial"            # b missed step 0's push
    runner = SimpleNamespace(payload_meta={})
    _set_meta(runner, trainer, weights="step-0", temperature=0.0)
    assert runner.payload_meta == {"weights": "step-0", "temperature": 0.0, "endpoints": ["http://a:1"]}
    worker = EndpointSampler(["http://a:1", "http://b:1"], check_versions=False)   # as after connect("")
    assert [ep.url for ep in worker._order(runner.payload_meta["endpoints"])] == ["http://a:1"]
    _set_meta(runner, trainer)      # cleared after the evaluation
    assert runner.payload_meta == {}
