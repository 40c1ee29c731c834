"""Decode-step attention over the engine's whole KV buffers, for CPUs.

A decode step attends one new token per row to that row's cached columns. The
engine keeps them in `[slots, kv_heads, capacity, head_dim]` buffers (see
`engine._SlotCache`), and the model is handed the live columns as a view, which is
not contiguous: its rows are `capacity` columns apart. On a CPU, torch's bfloat16
batched matmul copies such an operand first, and SDPA's CPU kernel, given
one to three query rows per key/value head, runs at a few GFLOP/s: at 16 rows of
~600 columns it took ~2.7 ms a layer for ~7 MB of keys and values (measured on
the bundled model; ~40% of a decode step).

Here the step attends to the buffers directly, each row to its own live columns
`[first[row], end)` (`SlotDecode`), in one of two ways:

- the C kernel of `native_attention` (where the host can build it): per row and
  key/value head one pass over the live keys and one over the live values, the
  query heads that share them together, scores, softmax and sums in float32;
- otherwise two torch matmuls over the first `rows` slots of the buffers as they
  are, which are contiguous, with an additive mask (`SlotDecode.bias`) that is 0
  on each row's own columns and -inf everywhere else: the margins of spare
  columns (zeros or earlier rows' keys, always finite) cost reading them, but
  plain matmuls on contiguous operands are faster than the view's. The
  scores come out of the matmul in the model's dtype (torch has no CPU bfloat16
  matmul with a float32 output; SDPA keeps them in float32), then the mask and
  the softmax are applied in float32.

The function is registered with transformers under `IMPLEMENTATION`; everything
that is not such a decode step (prefills, a forward without the engine's
`slot_decode` argument) goes to transformers' own SDPA function with the masks
SDPA gets, so a model switched to it computes the same as with "sdpa".
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from tryloop.agent import native_attention

IMPLEMENTATION = "tryloop_slots"


@dataclass
class SlotDecode:
    """What one decode step's attention needs besides the model's own arguments: the batch's
    buffers per layer and the columns each row attends to, `[first[row], end)`."""

    buffers: list[tuple[torch.Tensor, torch.Tensor]]   # per layer: keys, values [rows, kv_heads, capacity, dim]
    first: torch.Tensor                                # [rows] int64
    end: int

    @cached_property
    def bias(self) -> torch.Tensor:
        """The attended columns as an additive mask [rows, 1, 1, capacity], float32: 0 attended,
        -inf not (for the matmul path; built once a step, shared by the layers)."""
        keys = self.buffers[0][0]
        live = native_attention.live_columns(self.first, self.end, keys.shape[-2])
        bias = torch.zeros(live.shape, dtype=torch.float32, device=keys.device)
        return bias.masked_fill_(~live, float("-inf"))[:, None, None, :]


def slot_decode_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, scaling: float | None = None,
                          dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    step: SlotDecode | None = kwargs.pop("slot_decode", None)
    if step is None or query.shape[2] != 1 or dropout or kwargs.get("softcap") is not None \
            or getattr(module, "sinks", None) is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    keys, values = step.buffers[module.layer_idx]
    rows, heads, _, dim = query.shape
    kv_heads = keys.shape[1]
    scale = scaling if scaling is not None else dim ** -0.5
    native = native_attention.kernel()
    if native is not None and native.supports(query, keys, values):
        return native.attend(query, keys, values, step.first, step.end, scale), None
    # Query head h reads key/value head h // (heads // kv_heads), as transformers' repeat_kv has it.
    q = query.reshape(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(q, keys.transpose(-1, -2)).float()
    scores.mul_(scale).add_(step.bias)
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    out = torch.matmul(probs, values)                   # [rows, kv_heads, group, dim]
    return out.reshape(rows, 1, heads, dim), None       # transformers' layout: [batch, query, heads, dim]


def register() -> None:
    """Make `IMPLEMENTATION` known to transformers (attention and masks); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, slot_decode_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


#: The dtypes whose decode steps the torch-matmul path makes faster on a CPU. float32 is not among
#: them: its strided batched matmul is as fast as a contiguous one, and reading the buffers' margins
#: made decoding no faster (`tryloop bench generation`). The native kernel pays in both
#: (`native_attention.DTYPES`; float32 decoding 1.05-1.14x as fast at 1-32 rows,
#: benchmarks/README.md).
SLOT_ATTENTION_DTYPES = (torch.bfloat16,)


def use_slot_attention(model: Any, device: torch.device) -> bool:
    """Switch `model` from SDPA to `slot_attention` for decode steps, where that pays: on a CPU, in
    the native kernel's dtypes where it can be built, else in `SLOT_ATTENTION_DTYPES`. Models on
    other attention implementations, or that refuse the switch, keep theirs."""
    if device.type != "cpu":
        return False
    dtype = next(model.parameters()).dtype
    # Built (or found wanting) here, not inside the first decode step.
    native = native_attention.kernel()
    if dtype not in SLOT_ATTENTION_DTYPES and not (native is not None and dtype in native_attention.DTYPES):
        return False
    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", IMPLEMENTATION):
        return False
    # The step's buffers reach the attention as a keyword argument of the model's forward.
    if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(model.forward).parameters.values()):
        return False
    register()
    try:
        model.set_attn_implementation(IMPLEMENTATION)
    except (ValueError, ImportError, AttributeError):
        return False
    return model.config._attn_implementation == IMPLEMENTATION
