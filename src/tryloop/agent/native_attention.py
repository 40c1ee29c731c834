"""The C kernel of a decode step's attention (`native/slot_decode.c`): built once, checked, called.

A decode step attends one query token per head to each row's live columns of the engine's KV
buffers. torch has no CPU kernel for that shape that runs near memory speed: its batched matmuls
over 1-3 query rows per key/value head reached 4-7 GB/s, and a view of only the live columns is
copied first. The C loop reads each row's live keys and values once, in float32, at ~9 GB/s on
the bundled model's shapes (16 rows of ~550 live columns: 0.67-0.83 ms a layer against 1.5-2.5 ms
for the matmuls over the whole buffers), and is more exact than them: its scores are never
rounded to bfloat16.

It is compiled with the host's C compiler for the host's CPU (`-march=native`), cached under
`~/.cache/tryloop/native` by a digest of the source, the flags and the CPU's feature flags, and
loaded with ctypes (which releases the GIL during the call). Before first use its output is
checked against a float64 computation; if there is no compiler, the build fails or the check
does, `kernel()` returns None and says why once in the log; then a bfloat16 model's decode steps
use torch's matmuls over the buffers (`slot_attention`) and a float32 model keeps transformers'
own attention (SDPA).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "slot_decode.c"
# Reassociation lets the compiler spread the float32 sums over vector lanes (2x faster here);
# finite-math assumes the live keys and values are finite, which a model's are (a NaN from a
# diverged model still propagates through the loop's own exp). Not -ffast-math: with
# -shared, gcc 12 links crtfastmath.o, which on load sets flush-to-zero and denormals-are-zero for
# the whole process, changing every float computation of torch in it.
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
         "-fassociative-math", "-freciprocal-math", "-ffinite-math-only", "-fopenmp-simd",
         "-fPIC", "-shared")
DTYPES = {torch.bfloat16: "slot_decode_bf16", torch.float32: "slot_decode_f32"}
MAX_DIM = 512                     # the C loop's row buffer; larger heads take torch's matmuls
BUILD_TIMEOUT_S = 120.0


class NativeDecode:
    """The loaded kernel: `attend(...)` for a batch's rows."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int64
        self._fns = {}
        for dtype, name in DTYPES.items():
            fn = getattr(lib, name)
            fn.argtypes = [p, i, i, p, p, i, i, i, i, p, i, ctypes.c_float, p, i, i]
            fn.restype = ctypes.c_int
            self._fns[dtype] = fn
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._pool_lock = threading.Lock()        # engines in one process share this kernel

    def supports(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> bool:
        """Whether `attend` takes these tensors (else the caller uses torch's matmuls)."""
        return (query.device.type == keys.device.type == values.device.type == "cpu"
                and query.dtype in self._fns and query.dtype == keys.dtype == values.dtype
                and query.dim() == keys.dim() == 4 and query.shape[2] == 1
                and 0 < query.shape[-1] <= MAX_DIM
                and keys.is_contiguous() and values.is_contiguous() and keys.shape == values.shape)

    def attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               first: torch.Tensor, end: int, scale: float) -> torch.Tensor:
        """`query` [rows, heads, 1, dim]; `keys`, `values` [rows or more, kv_heads, capacity, dim],
        contiguous; row r attends to its columns [first[r], end). Returns [rows, 1, heads, dim]
        (transformers' attention output layout), in the query's dtype."""
        # The C loop trusts every pointer and size it is given: check them all here.
        if not self.supports(query, keys, values):
            raise ValueError(f"native decode attention takes contiguous CPU keys and values of the query's "
                             f"dtype ({', '.join(map(str, self._fns))}), one query token and a head size of "
                             f"at most {MAX_DIM}: got query {tuple(query.shape)} {query.dtype}, keys "
                             f"{tuple(keys.shape)} {keys.dtype}, values {tuple(values.shape)}")
        rows, heads, _, dim = query.shape
        slots, kv_heads, capacity, _ = keys.shape
        if first.shape != (rows,) or first.device.type != "cpu" or slots < rows or keys.shape[-1] != dim \
                or heads % kv_heads:
            raise ValueError(f"native decode attention: query {tuple(query.shape)}, keys "
                             f"{tuple(keys.shape)} and first {tuple(first.shape)} do not fit together")
        if query.stride(-1) != 1:
            query = query.contiguous()
        first = first.to(torch.int64).contiguous()
        out = torch.empty(rows, 1, heads, dim, dtype=query.dtype)
        fn = self._fns[query.dtype]

        def run(begin: int, stop: int) -> int:
            return fn(query.data_ptr(), query.stride(0), query.stride(1), keys.data_ptr(), values.data_ptr(),
                      kv_heads, capacity, dim, heads // kv_heads, first.data_ptr(), end, scale,
                      out.data_ptr(), begin, stop)

        # torch's thread count is the engine's budget for a step: split the rows as its ops would.
        parts = min(torch.get_num_threads(), rows)
        if parts <= 1:
            codes = [run(0, rows)]
        else:
            with self._pool_lock:
                if self._pool is None or self._pool_size < parts - 1:
                    old, self._pool = self._pool, ThreadPoolExecutor(parts - 1, thread_name_prefix="tryloop-attn")
                    self._pool_size = parts - 1
                    if old is not None:
                        old.shutdown(wait=False)      # its queued work still runs
                pool = self._pool
            bounds = [rows * k // parts for k in range(parts + 1)]
            futures = [pool.submit(run, bounds[k], bounds[k + 1]) for k in range(1, parts)]
            codes = [run(bounds[0], bounds[1])] + [f.result() for f in futures]
        if any(codes):
            raise ValueError(f"native decode attention refused its arguments (code {max(codes)}): "
                             f"query {tuple(query.shape)}, keys {tuple(keys.shape)}, end {end}")
        return out


def live_columns(first: torch.Tensor, end: int, capacity: int) -> torch.Tensor:
    """[rows, capacity] bool: True where row r attends, on its columns [first[r], end)."""
    cols = torch.arange(capacity, device=first.device)
    return (cols[None, :] >= first[:, None]) & (cols[None, :] < end)


def reference(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              first: torch.Tensor, end: int, scale: float) -> torch.Tensor:
    """What `NativeDecode.attend` computes, in float64 with torch ops (for checks)."""
    rows, heads, _, dim = query.shape
    kv_heads, capacity = keys.shape[1], keys.shape[2]
    q = query.double().reshape(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(q, keys[:rows].double().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~live_columns(first, end, capacity)[:, None, None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), values[:rows].double())
    return out.reshape(rows, 1, heads, dim)


def _cache_dir() -> Path:
    return Path.home() / ".cache" / "tryloop" / "native"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def _build() -> Path:
    from tryloop.sandbox.native import compile_cached, compiler

    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (install gcc)")
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join((cc, *FLAGS)).encode()
                            + _cpu_flags().encode()).hexdigest()[:16]
    out_dir = _cache_dir()
    target = out_dir / f"slot_decode-{digest}.so"
    if target.exists():
        return target
    error = compile_cached(target, [[cc, *FLAGS, str(SOURCE), "-lm"]], timeout_s=BUILD_TIMEOUT_S)
    if error is not None:
        raise RuntimeError(f"{cc} failed: {error.strip()[-2000:]}")
    return target


def _check(kernel: NativeDecode) -> None:
    """The kernel against `reference` on random buffers: both dtypes, a head size it specializes
    and one it does not, rows of different lengths, large values outside the live columns."""
    gen = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        for dim in (64, 24):
            rows, heads, kv_heads, cap, end = 3, 6, 2, 50, 41
            keys = (50 * torch.randn(rows + 1, kv_heads, cap, dim, generator=gen)).to(dtype)
            values = (50 * torch.randn(rows + 1, kv_heads, cap, dim, generator=gen)).to(dtype)
            keys[:, :, :end] /= 50
            values[:, :, :end] /= 50
            first = torch.tensor([40, 3, 20])
            query = torch.randn(rows, heads, 1, dim, generator=gen).to(dtype)
            got = kernel.attend(query, keys, values, first, end, 0.2)
            want = reference(query, keys, values, first, end, 0.2)
            err = float((got.double() - want).abs().max())
            if not err < tol:
                raise RuntimeError(f"{dtype} head size {dim}: off by {err:.3g} from float64")


@functools.cache
def kernel() -> NativeDecode | None:
    """The checked kernel, or None (the reason logged once) where it cannot be built or is wrong."""
    path = None
    try:
        path = _build()
        kernel = NativeDecode(ctypes.CDLL(str(path)))
        _check(kernel)
    except (OSError, RuntimeError, ValueError, AttributeError) as e:
        if path is not None:
            # A cached file that does not load or compute right is not kept: the next process
            # builds it again instead of trusting it.
            path.unlink(missing_ok=True)
        log.warning("native decode attention unavailable (bfloat16 decode steps use torch matmuls, "
                    "float32 ones transformers' SDPA): %s", e)
        return None
    return kernel
