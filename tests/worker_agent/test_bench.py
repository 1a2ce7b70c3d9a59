"""`echo2-agent bench` measures the engine `run` would use: the same --engine choice (auto, hf, vllm)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from typer.testing import CliRunner

from worker_agent.cli import app

HAS_VLLM_GPU = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def bench(model_dir, *args: str):
    return CliRunner().invoke(app, ["bench", "--model", str(model_dir), "--seconds", "0.2", "--max-new-tokens", "2",
                                    "--group-size", "2", "--groups", "1", "--threads", "1", "--json", *args])


@pytest.mark.skipif(HAS_VLLM_GPU, reason="auto picks vllm here")
def test_bench_measures_the_engine_run_would_pick(tiny_model_dir) -> None:
    auto = bench(tiny_model_dir)
    hf = bench(tiny_model_dir, "--engine", "hf", "--device", "cpu")

    for result in (auto, hf):
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert out["engine"] == "hf" and out["trajectories"] > 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_bench_with_vllm_missing_says_how_to_install_it(tiny_model_dir) -> None:
    result = bench(tiny_model_dir, "--engine", "vllm")

    assert result.exit_code == 1
    assert "--engine vllm: the vllm engine needs vLLM" in result.stderr
    assert "pip install 'echo2[vllm]'" in result.stderr


def test_bench_refuses_an_unknown_engine(tiny_model_dir) -> None:
    result = bench(tiny_model_dir, "--engine", "tgi")

    assert result.exit_code == 1
    assert "--engine: unknown engine 'tgi'; use auto, hf, vllm" in result.stderr
