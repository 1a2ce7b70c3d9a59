"""One GRPO step on the tiny model moves the policy toward the rewarded completion; gradient accumulation,
the KL term and bf16 autocast (GPU only) keep the update what it should be."""

from __future__ import annotations

import pytest
import torch

from dataplane.records import Trajectory
from learner.batch import collate, token_logprobs
from learner.distributed import DistContext
from learner.grpo import group_advantages
from learner.step import PolicyTrainer

from .helpers import grpo_step, loss_config


@pytest.fixture
def policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def completion_logprobs(model, records: list[Trajectory], pad_id: int) -> list[float]:
    """Sum of the log-probs of each record's completion tokens under ``model``."""
    batch = collate(records, pad_id=pad_id)
    model.eval()
    with torch.no_grad():
        logp = token_logprobs(model, batch)
    return (logp * batch.token_mask).sum(dim=1).tolist()


def make_group(tokenizer, group_id: str, prompt: str, answers: dict[str, float]) -> list[Trajectory]:
    prompt_ids = [tokenizer.bos_token_id, *tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    return [
        Trajectory(job_id=1, lease_id=f"lease-{group_id}", group_id=group_id, prompt=prompt, prompt_ids=prompt_ids,
                   completion=answer,
                   completion_ids=[*tokenizer(answer, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id],
                   logprobs=[-1.0] * (len(answer) + 1), reward=reward, version=0)
        for answer, reward in answers.items()
    ]


def on_policy(model, records: list[Trajectory], pad_id: int) -> list[Trajectory]:
    """The records with the behaviour log-probs a worker holding ``model`` would have reported."""
    batch = collate(records, pad_id=pad_id)
    with torch.no_grad():
        logp = token_logprobs(model.eval(), batch)
    out = []
    for row, rec in enumerate(records):
        start = len(rec.prompt_ids) - 1
        out.append(rec.model_copy(update={"logprobs": logp[row, start:start + len(rec.completion_ids)].tolist()}))
    return out


def test_grpo_step_raises_the_rewarded_completion(policy) -> None:
    model, tokenizer = policy
    pad = tokenizer.pad_token_id
    records = on_policy(model, [*make_group(tokenizer, "a", "3+4=", {"7": 1.0, "5": 0.0}),
                                *make_group(tokenizer, "b", "2+2=", {"1": 0.0, "4": 1.0})], pad)
    before_params = {name: p.detach().clone() for name, p in model.named_parameters()}
    before = completion_logprobs(model, records, pad)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    result = grpo_step(model, optimizer, records, pad_id=pad, clip_eps=0.2, device="cpu")

    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before_params[name])]
    assert changed, "no parameter moved"
    after = completion_logprobs(model, records, pad)
    assert after[0] > before[0]  # "7" for 3+4= had reward 1
    assert after[3] > before[3]  # "4" for 2+2= had reward 1
    assert after[1] < before[1]  # "5" for 3+4= had reward 0
    assert after[2] < before[2]  # "1" for 2+2= had reward 0
    # on-policy (ratio 1), advantages +-1 over equally long completions: the surrogate is -mean(A) = 0
    assert result.loss == pytest.approx(0.0, abs=1e-5)
    assert result.reward_mean == 0.5
    assert result.reward_std == 0.5
    assert result.clip_fraction == 0.0
    assert result.tokens == 8  # four completions of answer + eos


def copy_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def test_gradient_accumulation_equals_the_whole_batch(policy, tiny_model_dir) -> None:
    # micro-batches of one row each, with the whole batch's denominator, give the same update
    model, tokenizer = policy
    pad = tokenizer.pad_token_id
    records = on_policy(model, [*make_group(tokenizer, "a", "3+4=", {"7": 1.0, "55": 0.0, "1": 0.0}),
                                *make_group(tokenizer, "b", "2+2=", {"1": 0.0, "4": 1.0, "44": 1.0})], pad)
    settings = loss_config(aggregation="seq-mean-token-mean")
    results, params = [], []
    for micro_batch in (None, 1):
        fresh = copy_model(tiny_model_dir)
        # plain SGD: the parameter change is lr * gradient, so the comparison is as tight as the gradients
        trainer = PolicyTrainer(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1), settings, pad_id=pad,
                                micro_batch=micro_batch)
        results.append(trainer.step(records))
        params.append([p.detach().clone() for p in fresh.parameters()])

    assert results[1].loss == pytest.approx(results[0].loss, abs=1e-6)
    assert results[1].tokens == results[0].tokens == 14  # answer characters plus eos
    initial = [p.detach() for p in copy_model(tiny_model_dir).parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(initial, params[0], strict=True)), "no parameter moved"
    for whole, accumulated in zip(*params, strict=True):
        torch.testing.assert_close(accumulated, whole, rtol=0, atol=1e-6)


def test_a_decoupled_step_on_stale_records_weights_them_and_keeps_pi_prox_fixed_across_micro_batches(
        policy, tiny_model_dir) -> None:
    # records as a stale snapshot reported them: behaviour log-probs 0.4 below (weights e^0.4 = 1.49) or 0.3 above
    # (e^-0.3 = 0.74) the learner's. pi_prox is the parameters before the update, so micro-batches of one row give
    # the whole batch's update, and with one update per batch decoupled is TIS whose cap never binds.
    model, tokenizer = policy
    pad = tokenizer.pad_token_id
    fresh = on_policy(model, [*make_group(tokenizer, "a", "3+4=", {"7": 1.0, "55": 0.0, "1": 0.0}),
                              *make_group(tokenizer, "b", "2+2=", {"1": 0.0, "4": 1.0, "44": 1.0})], pad)
    stale = [r.model_copy(update={"logprobs": [lp + (-0.4 if i % 2 else 0.3) for lp in r.logprobs]})
             for i, r in enumerate(fresh)]
    before = completion_logprobs(model, stale, pad)
    runs = {}
    for name, settings, micro_batch in (("decoupled", loss_config(off_policy="decoupled"), None),
                                        ("decoupled, micro-batches", loss_config(off_policy="decoupled"), 1),
                                        ("tis, cap 1000", loss_config(off_policy="tis", is_cap=1000.0), None)):
        trained = copy_model(tiny_model_dir)
        trainer = PolicyTrainer(trained, torch.optim.SGD(trained.parameters(), lr=0.05), settings, pad_id=pad,
                                micro_batch=micro_batch)
        runs[name] = (trainer.step(stale), [p.detach().clone() for p in trained.parameters()], trained)

    result, params, trained = runs["decoupled"]
    metrics = result.metrics()
    assert metrics["clip_fraction"] == 0.0 and metrics["mean_ratio"] == pytest.approx(1.0)
    assert metrics["is_corrected_fraction"] == 0.0
    # the token-weighted mean of e^0.4 and e^-0.3 over rows of 2, 3, 2 (odd rows) and 2, 2, 3 tokens
    tokens = [len(r.completion_ids) for r in stale]
    expected = sum(n * (1.4918246976 if i % 2 else 0.7408182207) for i, n in enumerate(tokens)) / sum(tokens)
    assert metrics["is_weight_mean"] == pytest.approx(expected, rel=1e-6)
    for other in ("decoupled, micro-batches", "tis, cap 1000"):
        for a, b in zip(params, runs[other][1], strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    # the step climbs the weighted policy gradient's objective sum_i w_i A_i log pi(y_i): to first order (small lr)
    # its change is lr * |gradient|^2 > 0, whatever the weights do to single completions
    after = completion_logprobs(trained, stale, pad)
    weights = [1.4918246976 if i % 2 else 0.7408182207 for i in range(len(stale))]
    advantages = group_advantages(torch.tensor([r.reward for r in stale]), torch.tensor([0, 0, 0, 1, 1, 1]))
    rise = sum(w * a * (y - x) for w, a, x, y in zip(weights, advantages.tolist(), before, after, strict=True))
    assert rise > 0


def test_gradient_norm_is_reported_and_clipping_rescales_the_update(policy, tiny_model_dir) -> None:
    # With SGD the parameter change is lr * gradient: a clipped step is the unclipped one scaled by c / |g|.
    _, tokenizer = policy
    pad = tokenizer.pad_token_id
    records = on_policy(copy_model(tiny_model_dir), [*make_group(tokenizer, "a", "3+4=", {"7": 1.0, "5": 0.0}),
                                                     *make_group(tokenizer, "b", "2+2=", {"1": 0.0, "4": 1.0})], pad)
    initial = [p.detach().clone() for p in copy_model(tiny_model_dir).parameters()]
    deltas, norms = {}, {}
    for clip in (None, "half"):
        fresh = copy_model(tiny_model_dir)
        max_norm = None if clip is None else norms[None] / 2
        trainer = PolicyTrainer(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1), loss_config(), pad_id=pad,
                                max_grad_norm=max_norm)
        result = trainer.step(records)
        norms[clip] = result.grad_norm
        assert result.metrics()["grad_norm"] == result.grad_norm
        deltas[clip] = [after.detach() - before for after, before in zip(fresh.parameters(), initial, strict=True)]

    assert norms[None] > 0 and norms["half"] == pytest.approx(norms[None], rel=1e-6)  # reported before clipping
    moved = torch.cat([d.flatten() for d in deltas[None]])
    assert float(torch.linalg.vector_norm(moved)) == pytest.approx(0.1 * norms[None], rel=1e-4)
    for full, clipped in zip(deltas[None], deltas["half"], strict=True):
        torch.testing.assert_close(clipped, full / 2, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="max_grad_norm"):
        PolicyTrainer(copy_model(tiny_model_dir), torch.optim.SGD(initial, lr=0.1), loss_config(), pad_id=pad,
                      max_grad_norm=0.0)


def test_kl_to_the_reference_is_zero_first_then_pulls_back(policy, tiny_model_dir) -> None:
    model, tokenizer = policy
    pad = tokenizer.pad_token_id
    records = on_policy(model, make_group(tokenizer, "a", "3+4=", {"7": 1.0, "5": 0.0}), pad)
    reference = copy_model(tiny_model_dir).eval().requires_grad_(False)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), loss_config(kl_beta=0.5),
                            pad_id=pad, reference=reference)

    first = trainer.step(records)
    second = trainer.step(records)

    assert first.metrics()["kl"] == pytest.approx(0.0, abs=1e-9)  # the policy is the reference
    assert second.metrics()["kl"] > 0.0  # one update later it has moved away
    assert second.metrics()["kl_loss"] == pytest.approx(0.5 * second.metrics()["kl"], rel=1e-6)
    assert second.loss == pytest.approx(second.metrics()["pg_loss"] + second.metrics()["kl_loss"], rel=1e-6)


def test_bf16_is_refused_without_cuda(policy) -> None:
    model, tokenizer = policy
    with pytest.raises(ValueError, match="CUDA"):
        PolicyTrainer(model, torch.optim.AdamW(model.parameters()), loss_config(), pad_id=0, bf16=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_micro_batched_step_on_gpu_matches_fp32(policy, tiny_model_dir) -> None:
    _, tokenizer = policy
    pad = tokenizer.pad_token_id
    base = copy_model(tiny_model_dir)
    records = on_policy(base, [*make_group(tokenizer, "a", "3+4=", {"7": 1.0, "5": 0.0}),
                               *make_group(tokenizer, "b", "2+2=", {"1": 0.0, "4": 1.0})], pad)
    results = {}
    for bf16 in (False, True):
        model = copy_model(tiny_model_dir).to("cuda")
        trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), loss_config(), pad_id=pad,
                                micro_batch=2, bf16=bf16, ctx=DistContext(device="cuda"))
        results[bf16] = (trainer.step(records), completion_logprobs(model.cpu(), records, pad))

    before = completion_logprobs(base, records, pad)
    after = results[True][1]
    assert after[0] > before[0] and after[3] > before[3]  # the rewarded completions rose under bf16 too
    assert results[True][0].loss == pytest.approx(results[False][0].loss, abs=5e-2)
    for fp32, bf16 in zip(results[False][1], after, strict=True):
        assert bf16 == pytest.approx(fp32, abs=0.1)


def forwarded_rows(model) -> list[int]:
    """Rows each forward of ``model`` takes, recorded by a hook."""
    rows: list[int] = []
    model.register_forward_pre_hook(lambda _module, args, kwargs: rows.append(int(kwargs["input_ids"].shape[0])),
                                    with_kwargs=True)
    return rows


def update(model_dir, records_of, *, skip: bool, **fields):
    """Parameters after one AdamW step of ``PolicyTrainer`` (skipping idle rows or not), the rows forwarded, and the
    step's result."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    reference = AutoModelForCausalLM.from_pretrained(model_dir) if fields.get("kl_beta") else None
    records = records_of(model, tokenizer)
    rows = forwarded_rows(model)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1),
                            loss_config(**fields), pad_id=tokenizer.pad_token_id, reference=reference,
                            micro_batch=3, max_grad_norm=1.0, skip_idle_rows=skip)
    result = trainer.step(records)
    return {name: p.detach().clone() for name, p in model.named_parameters()}, rows, result


def mixed_and_uniform(model, tokenizer) -> list[Trajectory]:
    """Two groups with a winner and a loser, two whose answers all scored the same (advantage 0)."""
    return on_policy(model, [*make_group(tokenizer, "a", "3+4=", {"7": 1.0, "5": 0.0, "77": 0.0}),
                             *make_group(tokenizer, "b", "2+2=", {"1": 0.0, "9": 0.0, "12": 0.0}),
                             *make_group(tokenizer, "c", "5+1=", {"6": 1.0, "66": 1.0, "60": 1.0}),
                             *make_group(tokenizer, "d", "1+1=", {"3": 0.0, "2": 1.0, "22": 0.0})],
                     tokenizer.pad_token_id)


@pytest.mark.parametrize("fields", [{}, {"type": "gspo"}, {"aggregation": "seq-mean-token-sum-norm"},
                                    {"off_policy": "tis"}])
def test_rows_with_advantage_zero_are_skipped_and_the_update_is_unchanged(tiny_model_dir, fields) -> None:
    whole, whole_rows, whole_result = update(tiny_model_dir, mixed_and_uniform, skip=False, **fields)
    skipped, skipped_rows, result = update(tiny_model_dir, mixed_and_uniform, skip=True, **fields)
    assert sum(whole_rows) == 12 and sum(skipped_rows) == 6  # groups b and c carry no gradient
    assert (whole_result.trained_rows, result.trained_rows, result.sequences) == (12, 6, 12)
    assert (result.reward_mean, result.tokens) == (whole_result.reward_mean, whole_result.tokens)
    assert result.loss == pytest.approx(whole_result.loss, abs=1e-6)
    assert result.grad_norm == pytest.approx(whole_result.grad_norm, rel=1e-5)
    for name, value in whole.items():
        torch.testing.assert_close(skipped[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_a_batch_with_no_gradient_still_takes_the_optimizer_step(tiny_model_dir) -> None:
    def uniform(model, tokenizer):
        return on_policy(model, [*make_group(tokenizer, "b", "2+2=", {"1": 0.0, "9": 0.0}),
                                 *make_group(tokenizer, "c", "5+1=", {"6": 1.0, "66": 1.0})], tokenizer.pad_token_id)

    whole, _, _ = update(tiny_model_dir, uniform, skip=False)
    skipped, rows, result = update(tiny_model_dir, uniform, skip=True)
    assert sum(rows) == 1 and result.trained_rows == 1  # one row of weight 0: the step itself still happens
    for name, value in whole.items():  # AdamW's weight decay moved every weight the same way
        torch.testing.assert_close(skipped[name], value, rtol=0, atol=1e-7, msg=name)


def test_with_a_kl_term_every_row_is_trained(tiny_model_dir) -> None:
    _, rows, result = update(tiny_model_dir, mixed_and_uniform, skip=True, kl_beta=0.1)
    assert sum(rows) == 12 and result.trained_rows == 12
