"""Decoding tests' shared settings (the bundled model itself, `smollm2`, is the top conftest's)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread while a test decodes: the 2 cores are shared, and with 2 threads a
    busy neighbour slows decoding ~7x (OpenMP barriers wait for the descheduled thread)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Chat prompts of different lengths (real padding when batched), for the engine's tests.
QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "hi",
    "List three colours of the rainbow, then explain in one long sentence why the sky looks blue.",
]


@pytest.fixture(scope="session")
def prompts(smollm2) -> list[list[int]]:
    tok = smollm2.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                    return_dict=True)["input_ids"] for q in QUESTIONS]
