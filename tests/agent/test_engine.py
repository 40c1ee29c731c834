"""The continuous-batching engine on the real bundled model: exactness first, then the controls."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from tryloop.agent.engine import Engine, EngineClosed, EngineError, kv_bytes_per_token
from tryloop.agent.hf_policy import HFPolicy
from tryloop.agent.prefix_cache import PrefixCache


@pytest.fixture(autouse=True)
def _threads(one_thread):
    pass


@pytest.fixture(scope="module")
def engine(smollm2):
    # The engine is not bound to an event loop, so one serves every test's loop.
    with Engine(smollm2.model, smollm2.tokenizer, max_batch=16,
                weights_version=smollm2.weights_version) as eng:
        yield eng


def full_forward_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


async def test_greedy_is_identical_alone_and_batched(engine, prompts):
    assert len({len(p) for p in prompts}) == len(prompts)      # different lengths: real padding
    alone = [await engine.generate(p, max_new_tokens=12, temperature=0) for p in prompts]
    # Two start together, two join the running batch a few steps later.
    first = [asyncio.ensure_future(engine.generate(p, max_new_tokens=12, temperature=0))
             for p in prompts[:2]]
    while engine.stats().active < 2:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    later = [engine.generate(p, max_new_tokens=12, temperature=0) for p in prompts[2:]]
    batched = await asyncio.gather(*first, *later)
    assert [s.token_ids for s in batched] == [s.token_ids for s in alone]
    for a, b in zip(alone, batched, strict=True):
        assert a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.policy_logprobs, b.policy_logprobs, strict=True)) < 1e-4


async def test_logprobs_match_a_full_forward_pass(engine, smollm2, prompts):
    greedy, sampled = await asyncio.gather(
        engine.generate(prompts[1], max_new_tokens=10, temperature=0),
        engine.generate(prompts[3], max_new_tokens=10, temperature=1.0, seed=7))
    for prompt, s in ((prompts[1], greedy), (prompts[3], sampled)):
        ref = full_forward_logprobs(smollm2.model, prompt, s.token_ids)
        assert max(abs(r - x) for r, x in zip(ref, s.policy_logprobs, strict=True)) < 1e-4
        assert s.prompt_tokens == len(prompt)
        assert s.weights_versions == (smollm2.weights_version,)
    assert greedy.logprobs == [0.0] * len(greedy.token_ids)      # a point mass
    assert sampled.logprobs == sampled.policy_logprobs          # T=1, top_p=1: the raw policy
    again = await engine.generate(prompts[3], max_new_tokens=10, temperature=1.0, seed=7)
    assert again.token_ids == sampled.token_ids and again.seed == 7


async def test_temperature_and_top_p_logprobs_are_of_the_distribution_used(engine, smollm2, prompts):
    s = await engine.generate(prompts[0], max_new_tokens=6, temperature=0.7, top_p=0.9, seed=3)
    with torch.no_grad():
        logits = smollm2.model(torch.tensor([prompts[0] + s.token_ids])).logits[0].float()
    for i, (tok, lp) in enumerate(zip(s.token_ids, s.logprobs, strict=True)):
        probs = torch.softmax(logits[len(prompts[0]) - 1 + i] / 0.7, dim=-1)
        p_sorted, order = torch.sort(probs, descending=True)
        nucleus = order[(torch.cumsum(p_sorted, 0) - p_sorted) < 0.9]
        assert tok in nucleus.tolist()
        expected = torch.log(probs[tok] / probs[nucleus].sum())
        assert abs(lp - float(expected)) < 1e-4


async def test_stop_tokens_stop_strings_and_max_new_tokens(engine, smollm2, prompts):
    ref = await engine.generate(prompts[1], max_new_tokens=12, temperature=0)
    assert ref.finish_reason == "length" and len(ref.token_ids) == 12
    stop_at = ref.token_ids[4]
    cut = await engine.generate(prompts[1], max_new_tokens=12, temperature=0,
                                stop_token_ids=[stop_at])
    end = ref.token_ids.index(stop_at) + 1
    assert cut.token_ids == ref.token_ids[:end]                 # the stop token is kept
    assert (cut.finish_reason, cut.stop) == ("stop", stop_at)
    text = smollm2.tokenizer.decode(ref.token_ids[:6])
    by_string = await engine.generate(prompts[1], max_new_tokens=12, temperature=0,
                                      stop_strings=[text[-3:]])
    assert by_string.finish_reason == "stop" and by_string.stop == text[-3:]
    assert smollm2.tokenizer.decode(by_string.token_ids).endswith(text[-3:]) or \
        text[-3:] in smollm2.tokenizer.decode(by_string.token_ids)
    assert len(by_string.token_ids) <= 6
    # The model's own end of turn is a default stop token.
    short = await engine.generate(prompts[0], max_new_tokens=40, temperature=0)
    assert short.finish_reason == "stop" and short.token_ids[-1] == smollm2.tokenizer.eos_token_id
    one = await engine.generate(prompts[0], max_new_tokens=1, temperature=0)
    assert (len(one.token_ids), one.finish_reason) == (1, "length")


async def test_update_weights_changes_what_is_generated(smollm2, prompts):
    model = copy.deepcopy(smollm2.model)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    noisy = {k: v + 0.05 * torch.randn_like(v) if "mlp" in k else v for k, v in original.items()}
    async with Engine(model, smollm2.tokenizer, weights_version="w0") as eng:
        before = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        assert eng.stats().prefix_cache_bytes > 0
        assert await eng.update_weights(noisy) == "w0+1" == eng.weights_version
        assert eng.stats().prefix_cache_bytes == 0          # old weights' keys/values are gone
        after = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        assert after.token_ids != before.token_ids and after.weights_versions == ("w0+1",)
        assert await eng.update_weights(original, version="w2") == "w2"
        back = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        assert back.token_ids == before.token_ids
        # A trainer hands its live model: the engine copies from its tensors.
        learner_model = copy.deepcopy(smollm2.model)
        learner_model.load_state_dict(noisy)
        assert await eng.update_weights(learner_model, version="w3") == "w3"
        assert (await eng.generate(prompts[1], max_new_tokens=8, temperature=0)).token_ids == after.token_ids
        with pytest.raises(RuntimeError):                       # wrong keys: the caller hears it
            await eng.update_weights({"nope": torch.zeros(1)})
        assert eng.weights_version == "w3"


async def test_drop_prefix_cache_frees_it_and_keeps_the_weights(smollm2, prompts):
    async with Engine(smollm2.model, smollm2.tokenizer, weights_version="w0") as eng:
        before = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        assert eng.stats().prefix_cache_bytes > 0
        await eng.drop_prefix_cache()
        assert eng.stats().prefix_cache_bytes == 0 and eng.weights_version == "w0"
        again = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        assert again.token_ids == before.token_ids and again.weights_versions == ("w0",)
    with pytest.raises(EngineClosed):
        await eng.drop_prefix_cache()


def _weight_bytes(model) -> int:
    return sum(st.nbytes() for st in {p.untyped_storage().data_ptr(): p.untyped_storage()
                                      for p in model.parameters()}.values())


async def test_park_frees_the_weights_until_the_next_update(smollm2, prompts):
    model = copy.deepcopy(smollm2.model)
    learner = copy.deepcopy(smollm2.model)            # float32, as a trainer holds it
    async with Engine(model, smollm2.tokenizer, weights_version="w0", dtype="bfloat16") as eng:
        full = _weight_bytes(eng.model)
        before = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        await eng.park()
        assert eng.parked and eng.stats().prefix_cache_bytes == 0
        assert _weight_bytes(eng.model) == 0 < full        # every weight's memory is given back
        # A request made while parked waits for the weights instead of reading freed memory.
        waiting = asyncio.ensure_future(eng.generate(prompts[1], max_new_tokens=8, temperature=0))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        with pytest.raises(EngineError):                  # its own freed tensors are no weights
            await eng.update_weights(eng.model)
        with pytest.raises(RuntimeError):                 # a failed update leaves it parked
            await eng.update_weights({"nope": torch.zeros(1)})
        assert eng.parked and not waiting.done()
        assert await eng.update_weights(learner, version="w1") == "w1"
        assert not eng.parked and _weight_bytes(eng.model) == full
        after = await waiting
        assert after.token_ids == before.token_ids and after.weights_versions == ("w1",)
        assert eng.model.lm_head.weight.data_ptr() == eng.model.model.embed_tokens.weight.data_ptr()


async def test_park_frees_float32_weights_mapped_from_the_checkpoint(smollm2, prompts):
    """A float32 engine runs on the model as loaded, whose weights are mapped from the cached
    checkpoint: parking moves them off the file, so their memory is given back all the same."""
    from tryloop.agent.hf import load_model

    mapped = load_model("smollm2-135m", device="cpu").model
    async with Engine(mapped, smollm2.tokenizer, weights_version="w0", dtype="float32") as eng:
        full = _weight_bytes(eng.model)
        before = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        await eng.park()
        assert _weight_bytes(eng.model) == 0 < full
        assert await eng.update_weights(smollm2.model, version="w1") == "w1"
        assert _weight_bytes(eng.model) == full
        assert all(p.untyped_storage().resizable() for p in eng.model.parameters())   # parkable again
        after = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        assert after.token_ids == before.token_ids and after.logprobs == before.logprobs
        assert eng.model.lm_head.weight.data_ptr() == eng.model.model.embed_tokens.weight.data_ptr()


async def test_prefix_cache_serves_the_next_turn(smollm2, prompts):
    tok = smollm2.tokenizer
    delta = tok.encode("<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n",
                       add_special_tokens=False)
    results = {}
    for budget in (0, 256):
        async with Engine(smollm2.model, tok, prefix_cache_mb=budget) as eng:
            first = await eng.generate(prompts[0], max_new_tokens=4, temperature=0, stop_token_ids=[])
            second_prompt = prompts[0] + first.token_ids + delta
            second = await eng.generate(second_prompt, max_new_tokens=6, temperature=0)
            results[budget] = (first, second, eng.stats())
    (_, cold, cold_stats), (first, warm, warm_stats) = results[0], results[256]
    assert cold_stats.prefix_hit_tokens == 0
    # The whole first sequence but its last sampled token was in the cache.
    assert warm_stats.prefix_hit_tokens == len(prompts[0]) + len(first.token_ids) - 1
    assert warm.token_ids == cold.token_ids
    assert max(abs(a - b) for a, b in zip(warm.policy_logprobs, cold.policy_logprobs, strict=True)) < 1e-4


async def test_single_turn_engine_caches_prompts_not_completions(smollm2, prompts):
    """Without `cache_completions` the samples of a group still share their prompt, but no finished
    sequence is kept: the cache holds exactly the prompt's keys and values."""
    tok = smollm2.tokenizer
    async with Engine(smollm2.model, tok, prefix_cache_mb=256, cache_completions=False) as eng:
        first = await eng.generate(prompts[0], max_new_tokens=4, temperature=0, stop_token_ids=[])
        assert eng.stats().prefix_cache_bytes == kv_bytes_per_token(eng.model) * len(prompts[0])
        mate = await eng.generate(prompts[0], max_new_tokens=4, temperature=0, stop_token_ids=[])
        assert eng.stats().prefix_hit_tokens == len(prompts[0]) - 1     # all but the token that samples
        assert mate.token_ids == first.token_ids
        await eng.generate(prompts[0] + first.token_ids, max_new_tokens=2, temperature=0)
        assert eng.stats().prefix_hit_tokens == 2 * len(prompts[0]) - 1  # the prompt, not the completion


async def test_single_turn_policy_keeps_a_batch_of_prompts(smollm2, prompts):
    """Single-turn, the prefix cache holds at most a batch's worth of prompts (the ones a group's
    samples still to come can share), whatever their length: a byte budget sized for full contexts
    filled to a gigabyte with prompts nothing read again."""
    # float32: the model as loaded (an engine casts its model in place to another dtype).
    multi = HFPolicy(smollm2, max_context=1024, max_batch=2, dtype="float32")
    single = HFPolicy(smollm2, max_context=1024, max_batch=2, dtype="float32", multi_turn=False)
    try:
        assert multi.engine.cache_completions and multi.engine._prefixes.budget_bytes == 1024 * 2**20
        assert multi.engine._prefixes.max_entries is None
        assert not single.engine.cache_completions
        for p in prompts[:3]:
            await single.engine.generate(p, max_new_tokens=2, temperature=0, stop_token_ids=[])
        per_token = 2 * 30 * 3 * 64 * 4                    # layers x (k, v) x kv heads x head dim x fp32
        assert kv_bytes_per_token(single.engine.model) == per_token
        held = [e.tokens for e in single.engine._prefixes._entries]
        assert len(held) == 2 and all(h in prompts[:3] for h in held)      # a batch of 2: one went
        assert single.engine.stats().prefix_cache_bytes == per_token * sum(map(len, held))
    finally:
        multi.close()
        single.close()


async def test_cancelled_and_closed_requests(smollm2, prompts):
    eng = Engine(smollm2.model, smollm2.tokenizer, max_batch=1)
    running = asyncio.ensure_future(eng.generate(prompts[0], max_new_tokens=200, temperature=0,
                                                 stop_token_ids=[]))
    queued = asyncio.ensure_future(eng.generate(prompts[1], max_new_tokens=5, temperature=0))
    while eng.stats().active < 1:
        await asyncio.sleep(0.01)
    running.cancel()
    done = await queued                      # the cancelled row leaves, the queued one runs
    assert len(done.token_ids) == 5
    await asyncio.to_thread(eng.close)
    with pytest.raises(EngineClosed):
        await eng.generate(prompts[0], max_new_tokens=2)
    with pytest.raises(ValueError):
        Engine(smollm2.model, smollm2.tokenizer, max_batch=0)


async def test_stats_count_tokens_and_occupancy(engine, prompts):
    before = engine.stats()
    samples = await asyncio.gather(*[engine.generate(p, max_new_tokens=4, temperature=0)
                                     for p in prompts])
    after = engine.stats()
    assert after.tokens_generated - before.tokens_generated == sum(len(s.token_ids) for s in samples)
    assert after.requests_done - before.requests_done == len(prompts)
    assert after.tokens_per_s > 0 and after.mean_batch_occupancy >= 1
    assert (after.active, after.waiting) == (0, 0)


def test_prefix_cache_keeps_the_longest_and_the_most_recent():
    def kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.zeros(1, 1, n, 4), torch.zeros(1, 1, n, 4))]    # 32 bytes a token

    cache = PrefixCache(budget_bytes=32 * 100)
    a = list(range(40))
    cache.add(a, kv(40))
    cache.add(a + [1, 2, 3], kv(43))                # extends a: replaces it
    assert len(cache) == 1 and cache.nbytes == 32 * 43
    entry, hit = cache.lookup(a + [1, 2, 9, 9], limit=100)
    assert entry is not None and hit == 42
    assert cache.lookup(a + [1, 2, 3], limit=20)[1] == 20
    assert cache.lookup([7] * 40, limit=100) == (None, 0)
    assert cache.lookup(a[:10], limit=100) == (None, 0)     # under MIN_HIT: not worth it
    b = [5] * 50
    cache.add(b, kv(50))                            # 43 + 50 tokens fit
    cache.add([6] * 30, kv(30))                     # 123 do not: the least recently used goes
    assert len(cache) == 2 and cache.lookup(a, limit=100) == (None, 0)
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


def test_prefix_cache_holds_at_most_max_entries():
    def kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.zeros(1, 1, n, 4), torch.zeros(1, 1, n, 4))]

    cache = PrefixCache(budget_bytes=2**20, max_entries=2)
    a, b, c = [1] * 20, [2] * 20, [3] * 20
    cache.add(a, kv(20))
    cache.add(b, kv(20))
    assert cache.lookup(a, limit=100)[1] == 20          # a is now the most recently used
    cache.add(c, kv(20))                                # over two entries: b, the least recent, goes
    assert len(cache) == 2 and cache.nbytes == 2 * 32 * 20
    assert cache.lookup(b, limit=100) == (None, 0) and cache.lookup(a, limit=100)[1] == 20
    with pytest.raises(ValueError, match="max_entries"):
        PrefixCache(budget_bytes=100, max_entries=0)
