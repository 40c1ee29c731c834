"""The engine's linear layers with their weights pre-packed for oneDNN, on CPUs in bfloat16.

A decode step multiplies a few rows (one per sequence) by every weight matrix of
the model. torch's bfloat16 `linear` on a CPU repacks the weight into oneDNN's
blocked layout at every call, which for a few rows costs about as much as the
multiplication: at 16 rows the bundled model's 211 matmuls took ~82 ms of a
~190 ms decode step, the weights streaming from memory at ~2.7 GB/s. Packed once,
they stream at ~5.9 GB/s and the step's matmuls take ~36 ms (an AMD EPYC CPU with
AVX512-BF16, benchmarks/README.md). The products are bit for bit the same
numbers: `pack` checks that on a probe and packs nothing if they differ.

Scope. The packed copies serve only forwards run on the thread that holds
`PackedLinears.active()` (the engine's worker); any other caller of the same
modules, and anything that needs gradients, gets the plain `linear`. The copies
are taken from the weights as they are when `refresh()` runs: whoever changes
the weights calls it (the engine does at every weights update), and `drop()`
frees them (a parked engine). They cost a second copy of the linear weights.
One model object has one `PackedLinears` at a time (`pack` refuses a second); a
deep copy taken while packed computes with its own weights, unpacked.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _ops() -> tuple[Any, Any] | None:
    mkldnn = getattr(torch.ops, "mkldnn", None)
    try:
        return mkldnn._reorder_linear_weight, mkldnn._linear_pointwise   # type: ignore[union-attr]
    except (AttributeError, RuntimeError):
        return None


def packing_exact(dtype: torch.dtype, rows: int) -> bool:
    """Whether this torch and CPU pack `dtype` weights and multiply them exactly as `linear` does."""
    ops = _ops()
    if ops is None or not torch.backends.mkldnn.is_available():
        return False
    reorder, pointwise = ops
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 80, generator=gen).to(dtype)
    b = torch.randn(96, generator=gen).to(dtype)
    try:
        packed = reorder(w, rows)
        return all(torch.equal(pointwise(x, packed, b, "none", [], ""), F.linear(x, w, b))
                   for x in (torch.randn(n, 1, 80, generator=gen).to(dtype) for n in (1, rows, rows + 3)))
    except RuntimeError:                       # no oneDNN kernel for this dtype on this CPU
        return False


def packed_linear_fn(weight: torch.Tensor, rows: int) -> Any:
    """`x -> linear(x, weight)` through a packed copy of `weight` (for timing it alone)."""
    reorder, pointwise = _ops()                   # type: ignore[misc]
    packed = reorder(weight, rows)
    return lambda x: pointwise(x, packed, None, "none", [], "")


class PackedLinears:
    """Every `nn.Linear` of a model, with a packed copy of its weight used in `active()` forwards."""

    def __init__(self, model: nn.Module, rows: int) -> None:
        dtype = next(model.parameters()).dtype
        if not packing_exact(dtype, rows):
            raise ValueError(f"this torch and CPU have no packed {dtype} matmul that is exactly `linear` "
                             "(oneDNN's kernels for it): `pack` leaves such a model unpacked")
        self.rows = rows
        # Plain nn.Linear only: a subclass (quantized, LoRA) computes something else.
        self.modules = [m for m in model.modules() if type(m) is nn.Linear]
        self._packed: dict[int, torch.Tensor] = {}
        self._local = threading.local()
        self._pointwise = _ops()[1]               # type: ignore[index]
        for m in self.modules:
            # The instance's forward, bound to it: the class is untouched, and a deep copy of
            # the model rebinds it to the copied module, which finds no packed weight of its own.
            m.forward = types.MethodType(self._forward, m)

    def _forward(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        packed = self._packed.get(id(module))
        if packed is None or not getattr(self._local, "on", False) or torch.is_grad_enabled():
            return F.linear(x, module.weight, module.bias)
        return self._pointwise(x, packed, module.bias, "none", [], "")

    def refresh(self) -> None:
        """Pack the weights as they are now."""
        reorder, _ = _ops()                       # type: ignore[misc]
        self._packed = {}                         # the old copies go first: one copy at a time
        with torch.no_grad():
            self._packed = {id(m): reorder(m.weight.detach(), self.rows) for m in self.modules}

    def drop(self) -> None:
        """Free the packed copies; forwards use the plain weights until the next `refresh`."""
        self._packed = {}

    def release(self) -> None:
        """Free the packed copies and give the modules their class's forward back (where it is
        still this object's)."""
        self.drop()
        for m in self.modules:
            fwd = m.__dict__.get("forward")
            if isinstance(fwd, types.MethodType) and getattr(fwd.__func__, "__self__", None) is self:
                del m.forward

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Forwards on this thread use the packed copies while inside."""
        self._local.on = True
        try:
            yield
        finally:
            self._local.on = False


def pack(model: nn.Module, rows: int) -> PackedLinears | None:
    """Packed linears for `model` where that is exact: a CPU model whose weights are in a dtype
    `packing_exact` accepts (bfloat16 on CPUs with oneDNN's bf16 kernels); None elsewhere, and
    for a model another `PackedLinears` holds (a second engine on the same model object): its
    copies would not follow weights the first one loads."""
    params = next(model.parameters())
    if params.device.type != "cpu" or params.dtype != torch.bfloat16:
        return None
    if any("forward" in m.__dict__ for m in model.modules() if type(m) is nn.Linear):
        return None
    try:
        packed = PackedLinears(model, rows)
    except ValueError:                         # no exact packed matmul on this CPU
        return None
    packed.refresh()
    return packed
