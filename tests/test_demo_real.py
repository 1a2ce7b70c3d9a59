"""``make demo-real`` (echo2_site/demo_real.py): its jobs are valid job specs that evaluate held-out problems before and
after, and its verdict pairs the base's answers with the trained policy's by problem."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from dataplane.jobs import parse_job_spec
from echo2_site.demo_real import job_spec, verdict


@pytest.mark.parametrize("quick", [False, True])
def test_the_demo_jobs_train_on_the_training_split_and_evaluate_the_held_out_one(tmp_path, quick: bool) -> None:
    spec = parse_job_spec(job_spec(tmp_path, quick=quick, steps=None))
    assert spec.task["name"] == "word_problems" and spec.task["split"] == "train"
    assert spec.eval.before and spec.eval.after and spec.eval.split == "test"
    assert spec.prompt_format.chat and "####" in spec.prompt_format.system_prompt
    assert (spec.max_steps, spec.eval.problems) == ((2, 8) if quick else (48, 200))
    assert parse_job_spec(job_spec(tmp_path, quick=quick, steps=7)).max_steps == 7


def test_the_demo_trains_an_adapter_and_the_whole_model_at_a_tenth_of_its_rate(tmp_path) -> None:
    lora = parse_job_spec(job_spec(tmp_path, quick=False))
    full = parse_job_spec(job_spec(tmp_path, quick=False, lora_rank=0))
    assert (lora.lora.rank, full.lora.rank) == (16, 0) and "whole model" in full.name
    assert lora.learning_rate == pytest.approx(10 * full.learning_rate)
    assert parse_job_spec(job_spec(tmp_path, quick=False, lora_rank=32)).lora.rank == 32
    assert parse_job_spec(job_spec(tmp_path, quick=False, learning_rate=5e-5)).learning_rate == 5e-5
    assert parse_job_spec(job_spec(tmp_path, quick=False, eval_every=8)).eval.every == 8


def result(version: int, correct: list[float]) -> dict:
    return {"version": version, "problems": len(correct), "split": "test", "pass_at_1": sum(correct) / len(correct),
            "correct": correct}


def test_the_verdict_pairs_problems_and_says_whether_the_rise_is_noise() -> None:
    out = io.StringIO()
    console = Console(file=out, width=300)
    done = {"status": "completed", "status_reason": "reached 20 steps"}
    base, trained = [0.0] * 12 + [1.0] * 8, [1.0] * 11 + [0.0] + [1.0] * 8
    assert verdict(console, [result(0, base), result(20, trained)], done, 60.0) == 0
    text = out.getvalue()
    assert "v0 0.400 -> v20 0.950" in text and "11 problems gained, 0 lost" in text
    assert "p = 0.000977" in text and "not noise" in text  # 2 / 2**11
    out.truncate(0)
    assert verdict(console, [result(0, base), result(20, [1.0] + base[1:])], done, 60.0) == 0
    assert "no rise shown" in out.getvalue()  # 1 gained, 0 lost: p = 1
    assert verdict(console, [result(0, base)], {"status": "failed", "status_reason": "x"}, 5.0) == 2
