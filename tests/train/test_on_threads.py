"""The update runs on every core it was given, whichever pool thread runs it."""

from concurrent.futures import ThreadPoolExecutor

import torch

from tryloop.train.run import on_threads


def _parallel_op_then_count() -> int:
    torch.ones(64, 64) @ torch.ones(64, 64)   # a parallel op: the thread takes its count now
    return torch.get_num_threads()


def test_a_pool_thread_that_first_ran_on_one_thread_updates_on_all():
    before = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(1) as pool:
            torch.set_num_threads(1)                 # the rollouts' setting
            assert pool.submit(_parallel_op_then_count).result() == 1
            torch.set_num_threads(2)                 # the event loop's thread gives the update two
            # torch keeps the pool thread at the count it started with...
            assert pool.submit(_parallel_op_then_count).result() == 1
            # ...unless the update sets it in the thread that runs it,
            assert pool.submit(on_threads, 2, _parallel_op_then_count).result() == 2
            # and the thread is left as it was found.
            assert pool.submit(_parallel_op_then_count).result() == 1
    finally:
        torch.set_num_threads(before)
