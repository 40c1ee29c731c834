"""The engine's fast paths keep its contract: batched sampling, the in-place KV cache, bf16."""

from __future__ import annotations

import asyncio
import copy
import io
import json
from types import SimpleNamespace

import pytest
import torch

from tryloop.agent.engine import Engine, _SlotCache
from tryloop.agent.sampling import SamplingParams, sample_batch, sample_token


@pytest.fixture(autouse=True)
def _threads(one_thread):
    pass


# --- sampling -----------------------------------------------------------------------------------

def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_batched_sampling_does_not_depend_on_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 1000) * 3
    params = [SamplingParams(8), SamplingParams(8, temperature=0.7), SamplingParams(8, temperature=0),
              SamplingParams(8, top_p=0.9), SamplingParams(8, temperature=1.3, top_p=0.5), SamplingParams(8)]
    alone = [sample_batch(logits[i:i + 1], [p], [_gen(100 + i)])[0] for i, p in enumerate(params)]
    together = sample_batch(logits, params, [_gen(100 + i) for i in range(6)])
    order = [4, 0, 5, 2, 1, 3]                                   # other neighbours, other positions
    shuffled = sample_batch(logits[order], [params[i] for i in order], [_gen(100 + i) for i in order])
    assert together == alone
    assert [shuffled[order.index(i)] for i in range(6)] == alone
    assert sample_token(logits[3], params[3], _gen(103)) == alone[3]
    # A generator advances: the next draw of a row is not its first one again, and is reproducible.
    g1, g2 = _gen(7), _gen(7)
    seq1 = [sample_batch(logits[:1], params[:1], [g1])[0][0] for _ in range(20)]
    seq2 = [sample_batch(logits[:1], params[:1], [g2])[0][0] for _ in range(20)]
    assert seq1 == seq2 and len(set(seq1)) > 1


def test_batched_sampling_draws_from_the_stated_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]])
    probs = torch.softmax(logits[0], -1)
    n = 4000
    g = _gen(1)
    counts = torch.zeros(5)
    for _ in range(n // 100):
        out = sample_batch(logits.expand(100, 5), [SamplingParams(1)] * 100, [g] * 100)
        for tok, lp, plp in out:
            counts[tok] += 1
            assert lp == plp and abs(lp - float(probs[tok].log())) < 1e-5
    assert torch.allclose(counts / n, probs, atol=0.03)
    # top_p 0.7 keeps tokens 0 and 1 (mass before token 1 is 0.64 < 0.7); logprobs renormalized.
    out = sample_batch(logits.expand(200, 5), [SamplingParams(1, top_p=0.7)] * 200, [g] * 200)
    kept = probs[:2] / probs[:2].sum()
    assert {t for t, _, _ in out} == {0, 1}
    for tok, lp, plp in out:
        assert abs(lp - float(kept[tok].log())) < 1e-5 and abs(plp - float(probs[tok].log())) < 1e-5
    tok, lp, plp = sample_batch(logits, [SamplingParams(1, temperature=0)], [g])[0]
    assert (tok, lp) == (0, 0.0)


def test_two_level_inverse_cdf_finds_the_full_cumulative_sums_token():
    from tryloop.agent.sampling import CDF_BLOCK, _inverse_cdf

    torch.manual_seed(3)
    vocab = 3 * CDF_BLOCK + 77                           # full blocks and a short last one
    probs = torch.softmax(torch.randn(64, vocab) * 4, dim=-1)
    probs[:, CDF_BLOCK:2 * CDF_BLOCK] = 0.0              # a whole block without mass (outside a nucleus)
    probs[:, 5::7] = 0.0                                 # zeros between tokens with mass
    u = torch.rand(64, 1, dtype=torch.float64)
    u[:4, 0] = torch.tensor([0.0, 1.0 - 2 ** -53, 0.5, 0.999999])
    picked = _inverse_cdf(probs, u)
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
    expected = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=vocab - 1)
    assert (probs.gather(1, picked) > 0).all()
    # Sums in another order may move a draw by one token only where u falls within rounding of a
    # boundary; with random u, none does.
    assert torch.equal(picked[4:], expected[4:])
    assert picked[0, 0] == 0 and picked[1, 0] == int(torch.nonzero(probs[1]).max())
    # Rows without positive mass (NaN logits from a diverged model, or all zeros) still get an
    # index inside the vocabulary, which is not a whole number of blocks here.
    broken = torch.stack([torch.full((vocab,), float("nan")), torch.zeros(vocab)])
    assert (_inverse_cdf(broken, torch.rand(2, 1, dtype=torch.float64)) < vocab).all()


# --- the KV cache ---------------------------------------------------------------------------------

def _fake_cache(n: int, value: float) -> SimpleNamespace:
    t = torch.full((1, 2, n, 3), value)
    return SimpleNamespace(layers=[SimpleNamespace(keys=t, values=-t) for _ in range(2)])


def test_slot_cache_keeps_rows_right_aligned_through_growth_joins_and_drops():
    cache = _SlotCache(2, block=4, max_rows=8)
    expected: dict[int, list[float]] = {}
    ids: list[int] = []

    def check() -> None:
        for layer in cache.layers:
            assert layer.keys.shape[0] == len(ids) and layer.keys.shape[-2] == cache.length
            for i, rid in enumerate(ids):
                want = [0.0] * (cache.length - len(expected[rid])) + expected[rid]
                assert layer.keys[i, 1, :, 2].tolist() == want
                assert layer.values[i, 0, :, 0].tolist() == [-x for x in want]
                assert not layer._k[i, :, :cache.start].any()          # zeros left of the view

    def join(*rows: tuple[int, int, float]) -> None:
        cache.add([_fake_cache(n, v) for _, n, v in rows])
        for rid, n, v in rows:
            ids.append(rid)
            expected[rid] = [v] * n
        check()

    def step(value: float) -> None:
        cache.reserve(1)
        new = torch.full((len(ids), 2, 1, 3), value)
        for layer in cache.layers:
            layer.update(new, -new)
        for rid in ids:
            expected[rid].append(value)
        check()

    def drop(*rids: int) -> None:
        keep = [i for i, r in enumerate(ids) if r not in rids]
        order = cache.remove(keep, max(len(expected[ids[i]]) for i in keep))
        ids[:] = [ids[i] for i in order]
        check()

    join((1, 3, 1.0), (2, 5, 2.0))
    for s in range(9):                                  # past the right margin: regrows
        step(10.0 + s)
    join((3, 40, 3.0))                                  # longer than the left margin: reallocates
    join((4, 2, 4.0), (5, 6, 5.0))                      # fits: written into free slots
    step(30.0)
    drop(3)                                             # the longest leaves: the view shrinks
    drop(1, 4)
    step(31.0)
    join((6, 1, 6.0), (7, 2, 7.0), (8, 3, 8.0), (9, 4, 9.0), (10, 5, 10.0))   # 8 rows: more slots
    step(32.0)


async def test_cache_growth_keeps_outputs_equal_to_solo_runs(smollm2, prompts):
    """A small kv_block forces many regrowths; rows joining and leaving move rows between slots."""
    async with Engine(smollm2.model, smollm2.tokenizer, max_batch=3, kv_block=2, prefix_cache_mb=0) as eng:
        solo = [await eng.generate(p, max_new_tokens=n, temperature=0, stop_token_ids=[])
                for p, n in zip(prompts, (9, 14, 5, 12), strict=True)]
        batched = await asyncio.gather(*[
            eng.generate(p, max_new_tokens=n, temperature=0, stop_token_ids=[])
            for p, n in zip(prompts, (9, 14, 5, 12), strict=True)])
        assert eng.stats().mean_batch_occupancy > 1.2
    for a, b in zip(solo, batched, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.policy_logprobs, b.policy_logprobs, strict=True)) < 1e-4


async def test_seeded_samples_do_not_depend_on_the_batch(smollm2, prompts):
    async with Engine(smollm2.model, smollm2.tokenizer, max_batch=8) as eng:
        alone = await eng.generate(prompts[1], max_new_tokens=16, temperature=1.0, seed=11)
        others = [asyncio.ensure_future(eng.generate(p, max_new_tokens=20, temperature=0.8, top_p=0.9, seed=i))
                  for i, p in enumerate(prompts)]
        while eng.stats().active < 2:
            await asyncio.sleep(0.01)
        again = await eng.generate(prompts[1], max_new_tokens=16, temperature=1.0, seed=11)
        await asyncio.gather(*others)
    assert again.token_ids == alone.token_ids
    assert max(abs(x - y) for x, y in zip(again.logprobs, alone.logprobs, strict=True)) < 1e-4


# --- bfloat16 -------------------------------------------------------------------------------------

async def test_bf16_engine_takes_float32_weight_updates(smollm2, prompts):
    model = copy.deepcopy(smollm2.model)
    fp32 = {k: v.clone() for k, v in model.state_dict().items()}
    noisy = {k: v + 0.05 * torch.randn_like(v) if "mlp" in k else v for k, v in fp32.items()}
    async with Engine(model, smollm2.tokenizer, dtype="bfloat16", weights_version="w0") as eng:
        assert eng.dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.bfloat16
        before = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        ref = await _fp32_greedy(smollm2, prompts[1], 8)
        # bf16 rounding: the first tokens agree with float32, log-probabilities within ~0.1.
        assert before.token_ids[:3] == ref.token_ids[:3]
        assert abs(before.policy_logprobs[0] - ref.policy_logprobs[0]) < 0.1
        assert await eng.update_weights(noisy) == "w0+1"
        assert next(model.parameters()).dtype == torch.bfloat16
        after = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        assert after.token_ids != before.token_ids
        assert await eng.update_weights(fp32, version="w2") == "w2"
        back = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        assert back.token_ids == before.token_ids
        fresh = copy.deepcopy(smollm2.model)                     # a float32 module works too
        assert await eng.update_weights(fresh, version="w3") == "w3"
        assert (await eng.generate(prompts[1], max_new_tokens=8, temperature=0)).token_ids == before.token_ids
    with pytest.raises(ValueError):
        Engine(copy.deepcopy(smollm2.model), smollm2.tokenizer, dtype="int8")


async def _fp32_greedy(smollm2, prompt, n):
    async with Engine(smollm2.model, smollm2.tokenizer) as eng:
        return await eng.generate(prompt, max_new_tokens=n, temperature=0)


def test_engine_dtype_config():
    from tryloop.agent.config import PolicyConfig
    from tryloop.agent.hf import bf16_supported, resolve_engine_dtype

    assert PolicyConfig().dtype == "float32"
    assert PolicyConfig(dtype="auto").dtype == "auto"
    with pytest.raises(ValueError):
        PolicyConfig(dtype="float16")
    assert resolve_engine_dtype("float32", "cpu") == torch.float32
    assert resolve_engine_dtype("bfloat16", "cpu") == torch.bfloat16
    assert resolve_engine_dtype("auto", "cpu") == (torch.bfloat16 if bf16_supported("cpu") else torch.float32)


# --- the benchmark's arithmetic ---------------------------------------------------------------------

def test_generation_bench_helpers(smollm2, tmp_path, monkeypatch):
    from tryloop.bench.generation import (
        _weighted_pct,
        decode_gemm_seconds,
        flops_per_token,
        linear_shapes,
        train_step_split,
        training_prompts,
    )

    cfg = smollm2.model.config
    emb = cfg.vocab_size * cfg.hidden_size
    non_embedding = sum(p.numel() for p in smollm2.model.parameters()) - emb
    # 2 x non-embedding parameters (the norms' few weights aside) + 2 x the (tied) lm head
    assert flops_per_token(smollm2.model, 0) == pytest.approx(2 * non_embedding + 2 * emb, rel=1e-3)
    assert flops_per_token(smollm2.model, 100) > flops_per_token(smollm2.model, 0)
    assert linear_shapes(smollm2.model)[(cfg.hidden_size, cfg.vocab_size)] == 1
    # The decode-GEMM floor streams every Linear's own weights, each with M rows (a decode step's
    # reads), not one matrix per shape over and over (which sits in cache).
    seen: list[tuple[int, int]] = []
    real_linear = torch.nn.functional.linear

    def counting(x, w, b=None):
        seen.append((w.data_ptr(), x.shape[0]))
        return real_linear(x, w, b)

    monkeypatch.setattr(torch.nn.functional, "linear", counting)
    assert decode_gemm_seconds(smollm2.model, torch.float32, 3, min_s=0.0) > 0
    monkeypatch.undo()
    weights = [m.weight.data_ptr() for m in smollm2.model.modules() if isinstance(m, torch.nn.Linear)]
    timed = [(p, m) for p, m in seen if p in set(weights)]      # the packing probe's aside
    assert len(timed) % len(weights) == 0 and len(timed) >= 2 * len(weights)
    assert [p for p, _ in timed[:len(weights)]] == weights and {m for _, m in timed} == {3}
    prompts = training_prompts(smollm2.tokenizer, 3)
    assert len(prompts) == 3 and 200 < len(prompts[0]) < 800 and prompts[0] != prompts[1]
    assert _weighted_pct([(1.0, 1), (2.0, 3)], 0.5) == 2.0 and _weighted_pct([], 0.5) == 0.0
    rows = [{"step": 0, "time_generation_s": 10.0, "time_verification_s": 2.0, "time_environment_s": 1.0,
             "time_update_s": 3.0, "time_step_s": 12.0},
            {"step": 1, "time_generation_s": 20.0, "time_verification_s": 4.0, "time_environment_s": 3.0,
             "time_update_s": 5.0, "time_step_s": 20.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    split = train_step_split(tmp_path)
    assert split == {"steps": 2, "step_wall_s": 16.0, "mean_s": {
        "generation": 15.0, "verification": 3.0, "environment": 2.0, "update": 4.0}}


def test_generation_bench_runs_the_engine_beside_its_baselines(smollm2, tmp_path):
    """One small level of `tryloop bench generation`, end to end: the engine, the engine without
    its CPU kernels, HF generate and the floors, in the JSON and the table."""
    from rich.console import Console

    from tryloop.agent.hf import resolve_engine_dtype
    from tryloop.bench.generation import run

    # The dtype the train run samples in here: bf16 where the CPU multiplies it natively; without
    # that, emulated bf16 would make this one level take minutes.
    dtype = str(resolve_engine_dtype("auto", "cpu")).removeprefix("torch.")
    out = tmp_path / "gen.json"
    res = run(quick=True, concurrency=(2,), dtypes=(dtype,), out=out,       # one thread: the fixture
              console=Console(file=io.StringIO(), width=200))
    (row,) = json.loads(out.read_text())["levels"]
    assert row["concurrency"] == 2 and row["dtype"] == dtype and row["requests"] == 2
    for side in ("engine", "engine_plain", "hf_generate"):
        assert 16 * 2 <= row[side]["tokens"] <= 32 * 2 and row[side]["tokens_per_s"] > 0
    assert row["engine"]["tokens"] == row["engine_plain"]["tokens"] == row["hf_generate"]["tokens"]
    assert row["engine_over_plain"] == pytest.approx(
        row["engine"]["tokens_per_s"] / row["engine_plain"]["tokens_per_s"], abs=0.01)
    assert row["floor_decode_gemm_tokens_per_s"] > 0 and row["floor_peak_tokens_per_s"] > 0
    assert res["levels"][0]["engine_plain"] == row["engine_plain"]
