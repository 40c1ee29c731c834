"""The update's lean heap: large tensors freed inside it go back to the OS at once."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from tryloop.train import memory

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


_CHURN = """
import contextlib, os, sys, torch
from tryloop.train import memory

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

# A freed 30 MiB block raises glibc's mmap threshold to 30 MiB, as a run's first update does.
x = torch.ones(30 * 2**18)
del x
memory.release()
before = rss_mb()
keep, big = [], []
g = torch.Generator().manual_seed(0)
with memory.lean_heap() if sys.argv[1] == "lean" else contextlib.nullcontext():
    # Tensors of 1.5-24 MiB allocated and freed in a shuffled order (the shape of an update's
    # activations), a small one kept between them so freed blocks sit mid-heap.
    for i in range(60):
        big.append(torch.ones(int((1.5 + 22.5 * float(torch.rand((), generator=g))) * 2**20) // 4))
        keep.append(torch.ones(1024))
        if i % 3 == 2:
            big.pop(int(torch.randint(len(big), (), generator=g)))
    del big
    print(rss_mb() - before)
"""


def _churn(mode: str) -> float:
    """Resident growth (MiB) once every large tensor of the churn is freed, in a fresh process:
    a heap that earlier work left fragmented is reused before anything is mapped."""
    out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def test_large_tensors_freed_in_a_lean_heap_leave_nothing_resident():
    lean, default = _churn("lean"), _churn("default")
    assert lean < 16, f"{lean:.0f} MiB still resident after freeing every large tensor"
    assert default > 100, f"the default heap kept only {default:.0f} MiB: the test no longer shows the problem"


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
    now = _rss_mb()
    # The kernel's per-thread RSS counters are folded in lazily (up to a few hundred KiB apart).
    assert memory.peak_rss_mb() >= now - 1 and now >= 64
    del x
