"""The host-wide registry of sandboxes' id ranges: claims never collide, dead owners' are reclaimed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tryloop.errors import SandboxError
from tryloop.sandbox.idranges import RANGE, IdRanges, start_time

ME = (os.getpid(), start_time(os.getpid()))
TOP = 1 << 32


def test_ranges_lie_above_every_host_id_and_below_the_invalid_one(tmp_path):
    reg = IdRanges(tmp_path, 1 << 31, ME)
    bases = {reg.claim(f"sb{i}") for i in range(reg.count)}
    assert len(bases) == reg.count == 32767
    assert min(bases) == 1 << 31 and all(b % RANGE == 0 for b in bases)
    assert max(bases) + RANGE - 1 <= TOP - 2  # (uid_t)-1 is never handed out
    for bad in (TOP - RANGE, (1 << 31) + 1):
        with pytest.raises(ValueError):
            IdRanges(tmp_path, bad, ME)


def test_runtimes_with_different_first_ids_never_overlap(tmp_path):
    low, high = IdRanges(tmp_path, 1 << 31, ME), IdRanges(tmp_path, (1 << 31) + 4 * RANGE, ME)
    low._next, high._next = 4, 0  # both now aim at the range from 2**31 + 4 * 65536
    assert high.claim("a") == (1 << 31) + 4 * RANGE
    assert low.claim("b") == (1 << 31) + 5 * RANGE


def test_concurrent_registries_never_hand_out_one_range_twice(tmp_path):
    """Two runtimes (two registries on one directory) claiming at once, from many threads."""
    regs = [IdRanges(tmp_path, TOP - 9 * RANGE, ME) for _ in range(2)]  # 8 ranges only: contention
    assert regs[0].count == 8
    # Many rounds: a claim that lost track of where it started probing once missed the
    # last free range only now and then.
    with ThreadPoolExecutor(8) as pool:
        for _ in range(40):
            got = list(pool.map(lambda i: regs[i % 2].claim(f"sb{i}"), range(8)))
            assert sorted(got) == [TOP - 9 * RANGE + i * RANGE for i in range(8)]
            for base in got:
                regs[0].release(base)
        got = list(pool.map(lambda i: regs[i % 2].claim(f"sb{i}"), range(8)))
    with pytest.raises(SandboxError, match="in use"):
        regs[0].claim("one too many")
    regs[1].release(got[3])
    assert regs[0].claim("again") == got[3]


def test_dead_owners_ranges_are_reclaimed_live_ones_kept(tmp_path):
    reg = IdRanges(tmp_path, 1 << 31, ME)
    mine = reg.claim("live")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    orphan = IdRanges(tmp_path, 1 << 31, (dead_pid, 12345))
    crashed = orphan.claim("crashed")
    # A dead owner whose sandbox's init still runs keeps its range until the init is gone.
    held = orphan.claim("init still running")
    orphan.started(held, "init still running", os.getpid())
    assert reg.in_use()[held]["init_pid"] == os.getpid()
    assert reg.reclaim_dead() == [crashed]
    assert set(reg.in_use()) == {mine, held}
    reg.release(mine)
    assert set(reg.in_use()) == {held}


def test_a_registry_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "ids"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # a host user could delete claims and make two sandboxes share ids
    with pytest.raises(SandboxError, match="writable by it alone"):
        IdRanges(shared, 1 << 31, ME)


_CLAIMER = """
import json, os, sys
from pathlib import Path
from tryloop.sandbox.idranges import IdRanges, start_time
reg = IdRanges(Path(sys.argv[1]), int(sys.argv[2]), (os.getpid(), start_time(os.getpid())))
print(json.dumps([reg.claim(f"p{os.getpid()}-{i}") for i in range(int(sys.argv[3]))]))
"""


def test_concurrent_processes_never_share_a_range(tmp_path):
    """Runtimes are separate processes: four claim at once from one registry with room
    for exactly what they ask, each starting its search somewhere random."""
    first, per = TOP - 201 * RANGE, 50  # 200 ranges
    procs = [subprocess.Popen([sys.executable, "-c", _CLAIMER, str(tmp_path), str(first), str(per)],
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    got = [b for p in procs for b in json.loads(p.communicate(timeout=60)[0])]
    assert all(p.returncode == 0 for p in procs)
    assert len(got) == len(set(got)) == 200
