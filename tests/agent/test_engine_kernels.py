"""The engine's CPU kernels: decode attention over the KV buffers and packed bfloat16 linears."""

from __future__ import annotations

import asyncio
import copy
import threading

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tryloop.agent import native_attention
from tryloop.agent.engine import Engine
from tryloop.agent.packed_linear import PackedLinears, pack, packing_exact
from tryloop.agent.slot_attention import IMPLEMENTATION, SlotDecode, slot_decode_attention


@pytest.fixture(autouse=True)
def _threads(one_thread):
    pass


class _Attn(torch.nn.Module):
    def __init__(self, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.layer_idx, self.num_key_value_groups, self.is_causal = 0, heads // kv_heads, True


@pytest.fixture(params=["native", "matmul"])
def decode_path(request, monkeypatch):
    """Each decode-attention path: the C kernel (which the test machines can build: no skip) and
    torch's matmuls, which a host without a C compiler gets."""
    if request.param == "native":
        assert native_attention.kernel() is not None, "the native decode attention did not build"
    else:
        monkeypatch.setattr(native_attention, "kernel", lambda: None)
    return request.param


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_slot_attention_equals_sdpa_on_the_live_columns(dtype, tol, decode_path):
    gen = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, cap, dim, start, length = 5, 6, 2, 40, 16, 7, 21
    # Every column outside the live ones holds large finite values: nothing of them may leak.
    k_buf = (100 * torch.randn(rows + 2, kv_heads, cap, dim, generator=gen)).to(dtype)
    v_buf = (100 * torch.randn(rows + 2, kv_heads, cap, dim, generator=gen)).to(dtype)
    attended = torch.tensor([1, 5, 21, 13, 2])          # each row's last columns, up to start + length
    end = start + length
    k_buf[:rows, :, :end] = torch.randn(rows, kv_heads, end, dim, generator=gen).to(dtype)
    v_buf[:rows, :, :end] = torch.randn(rows, kv_heads, end, dim, generator=gen).to(dtype)
    query = torch.randn(rows, heads, 1, dim, generator=gen).to(dtype)
    cols = torch.arange(cap)
    live = (cols[None, :] >= (end - attended)[:, None]) & (cols[None, :] < end)
    module = _Attn(heads, kv_heads)
    step = SlotDecode([(k_buf[:rows], v_buf[:rows])], end - attended, end)
    ours, _ = slot_decode_attention(module, query, k_buf[:rows, :, start:end], v_buf[:rows, :, start:end], None,
                                    scaling=0.3, slot_decode=step)
    assert ("bias" in vars(step)) == (decode_path == "matmul")        # the native path needs no mask
    # transformers' SDPA on the view, masked as the engine masks it without these kernels.
    view_mask = live[:, None, None, start:end]
    ref, _ = sdpa_attention_forward(module, query, k_buf[:rows, :, start:end], v_buf[:rows, :, start:end],
                                    view_mask, scaling=0.3)
    assert ours.shape == ref.shape == (rows, 1, heads, dim)
    assert (ours.float() - ref.float()).abs().max() < tol
    # Without the engine's argument (a prefill, another caller) it is transformers' SDPA.
    plain, _ = slot_decode_attention(module, query, k_buf[:rows, :, start:end], v_buf[:rows, :, start:end],
                                     view_mask, scaling=0.3)
    assert torch.equal(plain, ref)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 4, 128), (6, 2, 40)])
def test_native_decode_attention_against_float64(dtype, tol, heads, kv_heads, dim):
    kernel = native_attention.kernel()
    assert kernel is not None
    gen = torch.Generator().manual_seed(1)
    rows, cap, end = 7, 300, 260
    keys = (30 * torch.randn(rows + 3, kv_heads, cap, dim, generator=gen)).to(dtype)
    values = (30 * torch.randn(rows + 3, kv_heads, cap, dim, generator=gen)).to(dtype)
    keys[:, :, :end] /= 30
    values[:, :, :end] /= 30
    first = torch.tensor([0, 259, 100, 17, 200, 1, 130])        # one column up to all of them
    query = torch.randn(rows, heads, 1, dim, generator=gen).to(dtype)
    want = native_attention.reference(query, keys, values, first, end, dim ** -0.5)
    got = kernel.attend(query, keys, values, first, end, dim ** -0.5)
    assert got.dtype == dtype and got.shape == (rows, 1, heads, dim)
    assert (got.double() - want).abs().max() < tol
    # A query whose rows and heads are not where a contiguous one has them (the kernel must
    # follow both strides).
    strided = torch.empty(heads, rows, 1, 2 * dim, dtype=dtype).transpose(0, 1)[..., :dim]
    strided.copy_(query)
    assert strided.stride(1) != dim and strided.stride(0) != heads * dim
    assert torch.equal(kernel.attend(strided, keys, values, first, end, dim ** -0.5), got)
    # Rows split over threads: the same numbers.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(kernel.attend(query, keys, values, first, end, dim ** -0.5), got)
    finally:
        torch.set_num_threads(threads)
    # Arguments the C loop would read out of bounds are refused before it runs.
    with pytest.raises(ValueError, match="refused"):
        kernel.attend(query, keys, values, first, cap + 1, 0.1)     # past the buffers' columns
    with pytest.raises(ValueError, match="do not fit"):
        kernel.attend(query, keys, values, first[:3], end, 0.1)      # a row without its columns
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    with pytest.raises(ValueError, match="takes contiguous"):
        kernel.attend(query.to(other), keys, values, first, end, 0.1)           # another dtype
    with pytest.raises(ValueError, match="takes contiguous"):
        kernel.attend(query, keys[:, :, 10:], values[:, :, 10:], first, end, 0.1)   # a strided view


def test_native_decode_attention_leaves_larger_heads_to_torch():
    kernel = native_attention.kernel()
    assert kernel is not None
    big = native_attention.MAX_DIM + 64
    query, keys = torch.zeros(2, 4, 1, big), torch.zeros(2, 2, 8, big)
    assert not kernel.supports(query, keys, keys)
    assert kernel.supports(query[..., :64], keys[..., :64].contiguous(), keys[..., :64].contiguous())
    # Through slot attention such a model takes the matmul path and gets the right answer.
    module = _Attn(4, 2)
    first = torch.tensor([2, 5])
    gen = torch.Generator().manual_seed(2)
    query, keys, values = (torch.randn(2, 4, 1, big, generator=gen), torch.randn(2, 2, 8, big, generator=gen),
                           torch.randn(2, 2, 8, big, generator=gen))
    out, _ = slot_decode_attention(module, query, keys, values, None, scaling=0.05,
                                   slot_decode=SlotDecode([(keys, values)], first, 8))
    want = native_attention.reference(query, keys, values, first, 8, 0.05)
    assert (out.double() - want).abs().max() < 1e-5


def test_native_decode_attention_builds_once_and_degrades_without_a_compiler(tmp_path, monkeypatch, caplog):
    import ctypes

    import tryloop.sandbox.native as sandbox_native

    monkeypatch.setattr(native_attention, "_cache_dir", lambda: tmp_path)
    built = native_attention._build()
    assert built.parent == tmp_path and built.suffix == ".so"
    assert native_attention._build() == built and len(list(tmp_path.iterdir())) == 1    # cached
    # Loading it leaves the process's float mode alone: denormals are still computed, not flushed
    # (a library built with -ffast-math would set flush-to-zero for every torch op in the process).
    ctypes.CDLL(str(built))
    tiny = torch.tensor([1e-40])
    assert (tiny * 1.0).item() > 0
    native_attention.kernel.cache_clear()
    monkeypatch.setattr(sandbox_native, "compiler", lambda: None)
    built.unlink()
    try:
        assert native_attention.kernel() is None
        assert "no C compiler" in caplog.text and "torch matmuls" in caplog.text
    finally:
        native_attention.kernel.cache_clear()


def _no_grad(fn, *args):
    with torch.inference_mode():
        return fn(*args)


def _bf16(smollm2):
    return copy.deepcopy(smollm2.model).to(torch.bfloat16).eval()


def test_packed_linears_are_the_same_numbers_on_the_thread_that_uses_them(smollm2):
    model = _bf16(smollm2)
    if not packing_exact(torch.bfloat16, 4):
        # A CPU without oneDNN's bf16 kernels (AVX2 only): nothing is packed, the model is untouched.
        with pytest.raises(ValueError, match="no packed torch.bfloat16 matmul"):
            PackedLinears(model, rows=4)
        assert pack(model, 4) is None and not any("forward" in m.__dict__ for m in model.modules())
        return
    ids = torch.tensor([smollm2.tokenizer.encode("def add(a, b):\n    return")])
    with torch.inference_mode():
        plain = model(ids).logits
    packed = PackedLinears(model, rows=4)
    packed.refresh()
    lin = model.model.layers[0].mlp.up_proj
    with torch.inference_mode():
        with packed.active():
            assert torch.equal(model(ids).logits, plain)
            # Weights changed in place: the active thread keeps the packed copy until a refresh.
            x = torch.randn(3, 1, lin.in_features).to(torch.bfloat16)
            old = lin(x)
            lin.weight.mul_(2)
            assert torch.equal(lin(x), old)
            packed.refresh()
            assert not torch.equal(lin(x), old)
            seen = {}
            other = threading.Thread(target=lambda: seen.setdefault("y", _no_grad(lin, x)))
            other.start()
            other.join()
        assert torch.equal(seen["y"], torch.nn.functional.linear(x, lin.weight))   # another thread: plain
        lin.weight.div_(2)
    # A deep copy of the model computes with its own weights, never the original's packed ones.
    twin = copy.deepcopy(model)
    twin.model.layers[0].mlp.up_proj.weight.data.zero_()
    with torch.inference_mode(), packed.active():
        assert torch.equal(twin.model.layers[0].mlp.up_proj(x), torch.zeros(3, 1, lin.out_features, dtype=x.dtype))
    # Gradients: the plain path, whatever the thread.
    with packed.active():
        y = lin(x.float().requires_grad_().to(torch.bfloat16))
        assert y.requires_grad
    packed.release()
    assert "forward" not in lin.__dict__


def test_pack_packs_only_where_it_is_exact(smollm2):
    assert pack(copy.deepcopy(smollm2.model), 16) is None          # float32: nothing to gain, not packed
    model = _bf16(smollm2)
    packed = pack(model, 16)
    assert (packed is not None) == packing_exact(torch.bfloat16, 16)
    if packed is not None:
        assert len(packed.modules) == 7 * model.config.num_hidden_layers + 1      # + the lm head
        packed.release()


async def test_engine_with_cpu_kernels_generates_what_it_did_without(smollm2, prompts, monkeypatch, decode_path):
    """Slot attention in float32 (the matmul path too, which the engine does not use in float32:
    no faster), so that both paths are exact up to float rounding: the same greedy tokens and
    log-probabilities through joins, drops and cache growth."""
    import tryloop.agent.slot_attention as slot_attention

    monkeypatch.setattr(slot_attention, "SLOT_ATTENTION_DTYPES", (torch.float32,))

    from transformers import AttentionInterface

    decode_calls = []

    def spy(module, query, key, value, mask, **kw):   # counts the decode steps that take the kernel's path
        if kw.get("slot_decode") is not None:
            decode_calls.append(query.shape[0])
        return slot_decode_attention(module, query, key, value, mask, **kw)

    async def run(cpu_kernels: bool):
        model = copy.deepcopy(smollm2.model)
        model.set_attn_implementation("sdpa")          # the session's model may have served an engine
        async with Engine(model, smollm2.tokenizer, max_batch=3, kv_block=4, cpu_kernels=cpu_kernels) as eng:
            assert eng._slot_attention == cpu_kernels
            assert (model.config._attn_implementation == IMPLEMENTATION) == cpu_kernels
            AttentionInterface.register(IMPLEMENTATION, spy)
            try:
                return await asyncio.gather(*[eng.generate(p, max_new_tokens=6 + 5 * i, temperature=0)
                                              for i, p in enumerate(prompts)])
            finally:
                AttentionInterface.register(IMPLEMENTATION, slot_decode_attention)
    on = await run(True)
    assert decode_calls and max(decode_calls) == 3      # every layer of every decode step, up to 3 rows
    decode_calls.clear()
    off = await run(False)
    assert not decode_calls
    assert [s.token_ids for s in on] == [s.token_ids for s in off]
    for a, b in zip(on, off, strict=True):
        assert max(abs(x - y) for x, y in zip(a.policy_logprobs, b.policy_logprobs, strict=True)) < 1e-4


async def _bf16_errors(smollm2, prompts, reference, cpu_kernels: bool) -> float:
    """Mean |engine - full forward| of the sampled tokens' log-probabilities, bfloat16 engine."""
    async with Engine(_bf16(smollm2), smollm2.tokenizer, max_batch=4, cpu_kernels=cpu_kernels) as eng:
        samples = await asyncio.gather(*[eng.generate(p, max_new_tokens=24, temperature=1.0, seed=i)
                                         for i, p in enumerate(prompts)])
    errors = []
    for p, s in zip(prompts, samples, strict=True):
        with torch.inference_mode():
            logits = reference(torch.tensor([p + s.token_ids])).logits[0].float()
        ref = torch.log_softmax(logits, -1)[torch.arange(len(p) - 1, len(p) - 1 + len(s.token_ids)),
                                              torch.tensor(s.token_ids)]
        errors += (ref - torch.tensor(s.policy_logprobs)).abs().tolist()
    return sum(errors) / len(errors)


async def test_bf16_engine_with_cpu_kernels_is_as_close_to_a_full_forward_as_without(smollm2, prompts):
    # bfloat16 rounds differently in a full forward and in decode steps (~0.03 on average):
    # the kernels must not add to that.
    reference = _bf16(smollm2)                            # transformers' own path, no kernels
    on = await _bf16_errors(smollm2, prompts, reference, True)
    off = await _bf16_errors(smollm2, prompts, reference, False)
    assert on < 0.1 and on < 1.5 * off + 0.01, (on, off)


async def test_bf16_engine_packed_weights_follow_updates(smollm2, prompts):
    model = _bf16(smollm2)
    async with Engine(model, smollm2.tokenizer, max_batch=4, weights_version="w0") as eng:
        before = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        # Weights changed in place, then announced: the packed copies follow them.
        with torch.no_grad():
            for name, w in model.named_parameters():
                if "mlp" in name:
                    w.add_(0.05 * torch.randn_like(w))
        await eng.update_weights(eng.model)
        after = await eng.generate(prompts[1], max_new_tokens=8, temperature=0)
        # A second engine on the same model object packs nothing: its copies would not follow
        # the weights the first one loads.
        async with Engine(model, smollm2.tokenizer, max_batch=4) as second:
            assert second._packed is None
    assert all("forward" not in m.__dict__ for m in model.modules())     # closed: plain modules again
    async with Engine(copy.deepcopy(model), smollm2.tokenizer, max_batch=4) as fresh:
        assert (fresh._packed is not None) == packing_exact(torch.bfloat16, 4)
        again = await fresh.generate(prompts[1], max_new_tokens=8, temperature=0)
    assert after.token_ids == again.token_ids != before.token_ids
    assert after.policy_logprobs == again.policy_logprobs


def test_the_kernels_are_a_policy_setting(smollm2):
    from tryloop.agent.config import PolicyConfig
    from tryloop.agent.hf_policy import HFPolicy
    from tryloop.serve.config import ServeModelConfig

    assert PolicyConfig().cpu_kernels and ServeModelConfig().cpu_kernels
    # float32: slot attention only with the native kernel (the matmul path is no faster there), no
    # packing (nothing to gain).
    for dtype, kernels, slots, native in (("bfloat16", True, True, True), ("bfloat16", False, False, True),
                                          ("float32", True, True, True), ("float32", True, False, False),
                                          ("bfloat16", True, True, False)):
        loaded = copy.copy(smollm2)
        loaded.model = copy.deepcopy(smollm2.model)
        with pytest.MonkeyPatch.context() as mp:
            if not native:
                mp.setattr(native_attention, "kernel", lambda: None)
            policy = HFPolicy(loaded, max_batch=2, dtype=dtype,
                              cpu_kernels=PolicyConfig(cpu_kernels=kernels).cpu_kernels)
        try:
            assert policy.engine._slot_attention == slots
            assert (policy.engine._packed is not None) == (
                kernels and dtype == "bfloat16" and packing_exact(torch.bfloat16, 2))
        finally:
            policy.engine.close()


# Small random models of other architectures that a Hugging Face checkpoint directory may hold:
# their own attention modules (fused projections, q/k norms, no rotary, scaled embeddings) all
# go through the engine's slot attention.
ARCHITECTURES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 512,
                                               "bos_token_id": 0, "eos_token_id": 0}),
}


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
async def test_engine_decodes_other_architectures_like_their_own_generate(arch, smollm2, prompts, decode_path,
                                                                          monkeypatch):
    import transformers

    import tryloop.agent.slot_attention as slot_attention

    monkeypatch.setattr(slot_attention, "SLOT_ATTENTION_DTYPES", (torch.float32,))   # the matmul path too

    config_cls, model_cls, extra = ARCHITECTURES[arch]
    shape = {} if arch == "gpt2" else {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                       "num_attention_heads": 4, "num_key_value_heads": 2,
                                       "max_position_embeddings": 512}
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(
        vocab_size=smollm2.model.config.vocab_size, **shape, **extra)).eval()
    expected = []
    for p in prompts:
        out = model.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, pad_token_id=0)
        expected.append(out[0, len(p):].tolist())
    async with Engine(model, smollm2.tokenizer, max_batch=4, kv_block=4, cpu_kernels=True) as eng:
        assert eng._slot_attention
        got = await asyncio.gather(*[eng.generate(p, max_new_tokens=8, temperature=0, stop_token_ids=[])
                                     for p in prompts])
    assert [s.token_ids for s in got] == expected
    with torch.no_grad():                       # and the log-probabilities of a full forward
        for p, s in zip(prompts, got, strict=True):
            ids = torch.tensor([p + s.token_ids])
            lp = torch.log_softmax(model(ids).logits[0, len(p) - 1:-1].double(), -1)
            full = lp.gather(1, torch.tensor(s.token_ids)[:, None])[:, 0]
            assert max(abs(a - b) for a, b in zip(s.policy_logprobs, full.tolist(), strict=True)) < 1e-4


def test_engine_refuses_sliding_window_caches(smollm2):
    from transformers import MistralConfig, MistralForCausalLM

    from tryloop.agent.engine import EngineError

    model = MistralForCausalLM(MistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                             sliding_window=8, architectures=["MistralForCausalLM"]))
    with pytest.raises(EngineError, match="MistralForCausalLM: the engine supports only models whose every layer"):
        Engine(model, smollm2.tokenizer, max_batch=2)
