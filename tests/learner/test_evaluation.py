"""The job's evaluation (learner/evaluation.py) on a tiny model: its greedy answers are the HF engine's, the
figures are the task's rewards of them, the same version scores the same twice, training does not notice it."""

from __future__ import annotations

import pytest
import torch

from dataplane.jobs import parse_job_spec
from learner.evaluation import Evaluation, paired_change
from learner.policy import load_model
from worker_agent.engines.base import SamplingParams
from worker_agent.engines.hf import HFEngine

TASK = {"name": "arithmetic", "max_operand": 4}


def evaluation(model_dir, **settings) -> Evaluation:
    from transformers import AutoTokenizer

    spec = parse_job_spec({"name": "e", "model_dir": str(model_dir), "task": TASK, "max_new_tokens": 2,
                           "eval": {"after": True, "problems": 24, "k": 3, **settings}})
    found = Evaluation.for_job(spec, AutoTokenizer.from_pretrained(model_dir))
    assert found is not None
    return found


def digit_answers(model: torch.nn.Module, tokenizer) -> torch.nn.Module:
    """The tiny model made to answer one digit, which digit depending on the prompt: some answers right, some wrong
    (the random model answers none of them)."""
    digits = tokenizer.convert_tokens_to_ids(list("0123456789"))
    with torch.no_grad():
        weight = model.lm_head.weight
        noise = torch.randn(len(digits), weight.shape[1], generator=torch.Generator().manual_seed(4)) * 5
        weight.zero_()
        weight[digits] = noise
    return model


def test_pass_at_1_scores_the_greedy_answers_workers_would_give(tiny_model_dir) -> None:
    run = evaluation(tiny_model_dir, max_new_tokens=1)
    model = digit_answers(load_model(str(tiny_model_dir)), run.tokenizer)
    result = run.run(model, 7)
    engine = HFEngine(str(tiny_model_dir), device="cpu")
    engine.model.load_state_dict(model.state_dict())
    answers = engine.generate(run.prompts, n=1, params=SamplingParams(max_new_tokens=1, temperature=0.0))
    expected = [run.task.reward(p, group[0].text) for p, group in zip(run.prompts, answers, strict=True)]
    assert 0 < sum(expected) < 24, expected
    assert result["correct"] == expected  # one at a time, left-padded in a batch: the same answers
    assert result["pass_at_1"] == pytest.approx(sum(expected) / 24)
    assert result["version"] == 7 and result["problems"] == 24 and result["k"] == 3 and result["seconds"] > 0
    assert 0.0 <= result["mean_at_k"] <= 1.0


def test_the_same_policy_scores_the_same_and_training_state_is_untouched(tiny_model_dir) -> None:
    model = load_model(str(tiny_model_dir)).train()
    run = evaluation(tiny_model_dir, temperature=1.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    first = run.run(model, 1)
    after_rng = torch.rand(1)
    torch.manual_seed(123)
    second = run.run(model, 1)
    assert torch.equal(after_rng, torch.rand(1))  # the training RNG goes on as if no evaluation ran
    assert (first["pass_at_1"], first["mean_at_k"]) == (second["pass_at_1"], second["mean_at_k"])
    assert model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_held_out_prompts_are_the_splits_and_off_means_none(tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    spec = parse_job_spec({"name": "e", "model_dir": str(tiny_model_dir), "task": {"name": "word_problems"},
                           "eval": {"before": True, "every": 5, "split": "test", "problems": 10}})
    run = Evaluation.for_job(spec, tokenizer)
    held_out = spec.eval.build_task(spec.task)
    assert run.prompts == held_out.prompts[:10]
    assert [v for v in range(0, 12) if run.due(v)] == [0, 5, 10]
    off = parse_job_spec({"name": "e", "model_dir": str(tiny_model_dir), "task": TASK})
    assert Evaluation.for_job(off, tokenizer) is None


def test_paired_change_counts_gains_losses_and_the_sign_test() -> None:
    before = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    after = [1, 1, 1, 1, 1, 1, 1, 0, 1, 0]
    change = paired_change(before, after)
    assert (change["gained"], change["lost"]) == (7, 1)
    assert change["p_value"] == pytest.approx(2 * (1 + 8) / 2**8)  # two-sided exact binomial, 8 discordant
    assert change["change"] == pytest.approx(0.6)
    assert paired_change([1, 0], [1, 0])["p_value"] == 1.0
    with pytest.raises(ValueError, match="not the same evaluation"):
        paired_change([1], [1, 0])
