"""A function-level task's reply becomes the answer file: fenced blocks, and bare code."""

from __future__ import annotations

from tryloop.agent.episode import answer_calls
from tryloop.tasks.sources.functions import TEMPLATES, function_task, make_variant


def task(tmp_path):
    return function_task(make_variant(TEMPLATES[0], 0), tmp_path / "t")


def test_fenced_block_bare_code_and_prose(tmp_path):
    t = task(tmp_path)
    fenced = answer_calls(t, "Here:\n```python\ndef f(x):\n    return x\n```\nDone.")
    assert [c.name for c in fenced] == ["write", "submit"]
    assert fenced[0].arguments["content"] == "def f(x):\n    return x\n"
    bare = answer_calls(t, "def f(x):\n    return x + 1\n```\n")     # the opening fence was dropped
    assert bare[0].arguments["content"] == "def f(x):\n    return x + 1\n"
    assert answer_calls(t, "I would write a function that adds numbers.") == []
    assert answer_calls(t, "x = 1\n") == []                            # code, but no function


def test_one_turn_answer_episodes_get_the_short_prompt(tmp_path):
    from tryloop.agent.episode import system_prompt

    t = task(tmp_path)
    short = system_prompt(t, max_turns=1)
    assert "```python" in short and "solution.py" in short and "<tool_call>" not in short
    assert "<tool_call>" in system_prompt(t, max_turns=2) and "<tool_call>" in system_prompt(t)
