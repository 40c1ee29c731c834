"""The update's lean heap: large tensors freed inside it go back to the OS at once."""

from __future__ import annotations

import os

import torch

from tryloop.train import memory

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def _churn(n: int) -> float:
    """Allocate and free `n` tensors of 1.5-24 MiB in a shuffled order (the shape of an update's
    activations), keeping a small tensor alive between them so freed blocks sit mid-heap.
    Returns the resident memory growth once all of the large ones are freed."""
    before = _rss_mb()
    keep, big = [], []
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        mib = 1.5 + 22.5 * float(torch.rand((), generator=g))
        big.append(torch.ones(int(mib * 2**20) // 4))     # touched: resident
        keep.append(torch.ones(1024))                      # pins the heap above it
        if i % 3 == 2:
            big.pop(int(torch.randint(len(big), (), generator=g)))
    del big
    return _rss_mb() - before


def test_large_tensors_freed_in_a_lean_heap_leave_nothing_resident():
    memory.release()
    with memory.lean_heap():
        grown = _churn(60)
    assert grown < 16, f"{grown:.0f} MiB still resident after freeing every large tensor"


def test_lean_heap_is_a_no_op_without_glibc(monkeypatch):
    memory._libc.cache_clear()
    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(name)))
    try:
        with memory.lean_heap():
            pass
        memory.release()
        assert memory._libc() is None
    finally:
        memory._libc.cache_clear()


def test_peak_rss_covers_what_was_resident():
    x = torch.ones(64 * 2**20 // 4)   # 64 MiB, touched
    assert memory.peak_rss_mb() >= _rss_mb() >= 64
    del x
