"""Host memory of a CPU training process: what the C heap keeps, and the process's peak.

On CPU every tensor is a `malloc`. glibc serves blocks below its mmap threshold from heaps it
rarely returns to the OS, and it raises that threshold (up to 32 MiB) each time a larger
mmapped block is freed. An update allocates and frees hundreds of megabytes in blocks of one to
a few dozen megabytes (activations, gradients, recomputed layers) in an order that changes from
one micro-batch to the next, so those blocks land in the heap and fragment it: the second update
of a 135M model peaked about a gigabyte above the first, with the same tensors alive.
`lean_heap` pins the threshold low for the update, so every large tensor is its own mapping and
goes back to the OS when freed. Generation alone keeps the default (its blocks are reused as they
are); with `train.overlap` the next step's rollouts run under the update's threshold too.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import resource
from collections.abc import Iterator
from functools import cache

_M_MMAP_THRESHOLD = -3     # mallopt parameter (malloc.h)
#: glibc's own ceiling for the threshold it raises by itself; restored after `lean_heap`, so the
#: rest of the process behaves as it does once that dynamic threshold has grown.
_DEFAULT_MAX_THRESHOLD = 32 << 20
#: Blocks from this size up are mapped one by one during an update. Smaller ones (parameters'
#: views, Python objects) stay in the heap; 1 MiB kept nearly all of the gain of 64 KiB.
LEAN_THRESHOLD = 1 << 20


@cache
def _libc() -> ctypes.CDLL | None:
    """glibc, or None where the C library is another one (musl, macOS): nothing to tune then."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - both must exist
    except (OSError, AttributeError):
        return None
    return libc


def release() -> None:
    """Collect garbage and hand free heap pages back to the OS (`malloc_trim`)."""
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@contextlib.contextmanager
def lean_heap(threshold: int = LEAN_THRESHOLD) -> Iterator[None]:
    """Within the block, blocks of `threshold` bytes and up are mmapped, so freeing them returns
    their memory at once. The process-wide setting is changed: run nothing else that allocates
    heavily meanwhile (without train.overlap the train loop runs the update alone; with it the next
    step's rollouts run beside the update and their allocations fall under the same threshold)."""
    libc = _libc()
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, threshold)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_THRESHOLD, _DEFAULT_MAX_THRESHOLD)
        release()


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: KiB
