"""The prompt a micro-batch shares, run once (`algo.shared_prefix`): on the bundled SmolLM2 the
log-probabilities and the gradients are those of the plain full-sequence pass, with activation
checkpointing on and off, under LoRA, and with rows of different lengths (padding)."""

from __future__ import annotations

import copy

import pytest
import torch

from tryloop.agent.trajectory import Trajectory
from tryloop.train import shared_prefix
from tryloop.train.config import TrainConfig
from tryloop.train.update import Learner

SYSTEM = "You are a careful Python programmer. Answer with one function in a code block."
ASKS = ["Implement add(a, b).", "Implement is_even(n).", "Implement add(a, b).", "Implement is_even(n)."]
ANSWERS = ["```python\ndef add(a, b):\n    return a + b\n```",
           "```python\ndef is_even(n):\n    return n % 2 == 0\n```",
           "```python\ndef add(a, b):\n    return b + a  # either order\n```",
           "```python\ndef is_even(n):\n    return not n & 1\n```"]


def episodes(tok) -> list[Trajectory]:
    """Four episodes, two groups of two: a group shares its whole prompt, all share the system
    prompt; answers of different lengths, so the batch is padded."""
    out = []
    for i, (ask, answer) in enumerate(zip(ASKS, ANSWERS, strict=True)):
        prompt = tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}],
                                         add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        completion = tok(answer, add_special_tokens=False)["input_ids"]
        out.append(Trajectory(episode_id=f"e{i}", task_id=ask, group_id=ask, token_ids=[*prompt, *completion],
                              logprobs=[0.0] * (len(prompt) + len(completion)),
                              loss_mask=[0] * len(prompt) + [1] * len(completion), prompt_length=len(prompt)))
    return out


def gradients(learner: Learner, trajs: list[Trajectory]) -> dict[str, torch.Tensor]:
    """The gradient of a loss on every sampled token's log-probability (one micro-batch)."""
    batch = learner._plan(trajs, [1.0, -0.5, 0.25, -1.0])[0][0]
    learner.model.train()
    logp = learner._forward(learner.model, batch)
    (logp * batch.advantages).sum().backward()
    return {n: p.grad.detach().clone() for n, p in learner.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("checkpointing", "lora"), [(True, False), (False, False), (True, True)])
def test_the_shared_prefix_gives_the_full_passes_logprobs_and_gradients(smollm2, checkpointing, lora):
    model, tok = smollm2.model, smollm2.tokenizer
    trajs = episodes(tok)
    batch = Learner(copy.deepcopy(model), TrainConfig(micro_batch=4), tokenizer=tok)._plan(trajs, [0.0] * 4)[0][0]
    p = shared_prefix.prefix_length(batch.input_ids, batch.attention_mask)
    assert p >= len(tok(SYSTEM)["input_ids"])          # at least the system prompt is shared
    # Micro-batches of two: the plan puts each group's two episodes together (they come apart in
    # `trajs`), and their whole prompt is run once.
    pairs = Learner(copy.deepcopy(model), TrainConfig(micro_batch=2), tokenizer=tok)._plan(trajs, [0.0] * 4)[0]
    assert all(shared_prefix.prefix_length(b.input_ids, b.attention_mask) >= trajs[0].prompt_length for b in pairs)

    def learner(shared: bool) -> Learner:
        torch.manual_seed(0)   # the same LoRA initialisation in both
        cfg = TrainConfig(micro_batch=4, amp="off", activation_checkpointing=checkpointing, lora=lora,
                          shared_prefix=shared, lora_targets=["q_proj", "v_proj"])
        return Learner(copy.deepcopy(model), cfg, tokenizer=tok)

    plain, shared = learner(False), learner(True)
    assert shared.shared_prefix and not plain.shared_prefix
    lp_plain, lp_shared = plain.logprobs(trajs), shared.logprobs(trajs)
    for a, b in zip(lp_plain, lp_shared, strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=2e-4), max(abs(x - y) for x, y in zip(a, b, strict=True))
    g_plain, g_shared = gradients(plain, trajs), gradients(shared, trajs)
    assert g_plain.keys() == g_shared.keys() and g_plain
    for name, g in g_plain.items():
        scale = float(g.abs().max()) or 1.0
        err = float((g - g_shared[name]).abs().max()) / scale
        assert err < 2e-3, (name, err)
    # The prefix's own parameters got gradient from every row: the embedding rows of the system
    # prompt's tokens are not zero (they are only ever seen in the prefix pass).
    if not lora:
        emb = dict(shared.model.named_parameters())["model.embed_tokens.weight"].grad
        assert emb is not None and float(emb[batch.input_ids[0, :p]].abs().sum()) > 0


def test_what_is_not_shared_takes_the_plain_path():
    ids = torch.tensor([[1] * 20 + [2, 3], [1] * 20 + [4, 0]])
    mask = torch.tensor([[1] * 22, [1] * 21 + [0]])
    assert shared_prefix.prefix_length(ids, mask) == 20
    assert shared_prefix.prefix_length(ids[:1], mask[:1]) == 0          # one row: nothing to share
    assert shared_prefix.prefix_length(ids[:, 10:], mask[:, 10:]) == 0  # 10 < MIN_PREFIX shared tokens
    # A row that is all prefix keeps its last token for itself.
    same = torch.tensor([[1] * 20, [1] * 20])
    assert shared_prefix.prefix_length(same, torch.ones_like(same)) == 19
    # Padding inside the would-be prefix ends it.
    short = torch.tensor([[1] * 17 + [0] * 5, [1] * 22])
    assert shared_prefix.prefix_length(short, (short > 0).long()) == 16
