"""llama.cpp's server as the generation benchmark's second engine: what a bad binary gets."""

from __future__ import annotations

import io

import pytest

from tryloop.bench.llamacpp import LlamaServerError, _sampled, start_server


def test_a_missing_binary_is_named(tmp_path):
    with pytest.raises(LlamaServerError, match="nope/llama-server is not an executable file"):
        start_server(tmp_path / "nope" / "llama-server", tmp_path / "m.gguf", slots=1, ctx=512, threads=1)


def test_the_benchmark_refuses_a_wrong_binary_before_measuring_anything(tmp_path):
    from tryloop.bench.generation import run

    text = tmp_path / "llama-server"
    text.write_text("not a program")            # exists, but cannot be executed
    with pytest.raises(LlamaServerError, match="is not an executable file"):
        run(quick=True, llama_server=text, out=tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


def test_a_binary_that_exits_reports_its_status_and_stderr(tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'error: unknown argument: --parallel' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(LlamaServerError, match=r"exited with status 3: error: unknown argument: --parallel"):
        start_server(fake, tmp_path / "m.gguf", slots=1, ctx=512, threads=1, timeout_s=30)


def test_sampled_counts_tokens_and_those_with_a_log_probability():
    answer = {"tokens_predicted": 3, "completion_probabilities": [
        {"id": 5, "logprob": -0.1}, {"id": 9, "logprob": -2.3}, {"id": 1}]}
    assert _sampled(answer) == (3, 2)
    assert _sampled({"tokens": [1, 2]}) == (2, 0)


def test_a_level_whose_server_fails_is_recorded_and_the_table_shows_it(tmp_path):
    from rich.console import Console

    from tryloop.bench.generation import _llama_row, _llama_table

    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'failed to load model' >&2\nexit 1\n")
    fake.chmod(0o755)
    res = {"levels": [], "llama_server": []}
    row = _llama_row(fake, tmp_path / "m.gguf", [[1, 2, 3]], [4], 1, res, Console(file=io.StringIO()))
    assert row["concurrency"] == 1 and "failed to load model" in row["error"]
    res["llama_server"].append(row)
    assert _llama_table(res).row_count == 1
