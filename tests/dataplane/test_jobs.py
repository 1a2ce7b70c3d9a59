"""Job specs: defaults are resolved (kappa = S-1), every bad field is named in JobSpecError (all of them at once),
and an unknown key is refused with the nearest known name."""

from __future__ import annotations

from typing import Any

import pytest

from dataplane.jobs import JobSpec, JobSpecError, model_dir_problem, parse_job_spec


def job(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"name": "tiny arithmetic", "model_dir": "/models/tiny", "task": {"name": "arithmetic"}}
    raw.update(changes)
    return raw


def test_defaults_are_resolved() -> None:
    spec = parse_job_spec(job())

    assert spec.staleness == 3
    assert spec.kappa == 2  # S - 1
    assert spec.batch_trajectories == 128
    assert spec.group_size == 8
    assert spec.groups_per_step == 16  # R / n
    assert spec.clip_eps == 0.2
    assert spec.learning_rate == 1e-3
    assert spec.target_reward is None
    assert (spec.snapshot_dtype, spec.snapshot_full_every) == ("bf16", 0)  # bf16 snapshots, deltas after the first
    # the task spec is stored resolved, so every worker builds the very same adapter
    assert spec.task == {"name": "arithmetic", "max_operand": 9, "ops": "+", "modulus": 10}


@pytest.mark.parametrize(("staleness", "kappa"), [(2, 1), (5, 4), (10, 9)])
def test_kappa_defaults_to_staleness_minus_one(staleness: int, kappa: int) -> None:
    assert parse_job_spec(job(staleness=staleness)).kappa == kappa


def test_explicit_values_are_kept() -> None:
    spec = parse_job_spec(job(staleness=6, kappa=2, batch_trajectories=60, group_size=4, learning_rate=0.5,
                              task={"name": "arithmetic", "ops": "+*", "modulus": 97}))

    assert (spec.staleness, spec.kappa, spec.batch_trajectories, spec.group_size) == (6, 2, 60, 4)
    assert spec.groups_per_step == 15
    assert spec.learning_rate == 0.5
    assert spec.task == {"name": "arithmetic", "max_operand": 9, "ops": "+*", "modulus": 97}


@pytest.mark.parametrize(("changes", "field", "message"), [
    ({"stalenes": 4}, "stalenes", "unknown key (did you mean staleness?)"),
    ({"colour_scheme": "blue"}, "colour_scheme", "unknown key"),  # "colour" is 0.6 from "lora"
    ({"kl_beta": 0.1}, "kl_beta", "unknown key (did you mean loss.kl_beta?)"),  # a loss setting at the top
    ({"loss": {"kl_bta": 0.1}}, "loss.kl_bta", "unknown key (did you mean loss.kl_beta?)"),
])
def test_an_unknown_key_is_refused_with_the_nearest_known_name(changes, field: str, message: str) -> None:
    """A misspelt key used to be dropped in silence and its default trained with."""
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(job(**changes))

    assert (err.value.field, err.value.message) == (field, message)


def test_every_error_is_reported_at_once() -> None:
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(job(stalenes=4, learning_rate=5, top_p=0, loss={"kl_bta": 0.1, "kl_beta": -1}))

    assert err.value.errors == [
        ("stalenes", "unknown key (did you mean staleness?)"),
        ("loss.kl_bta", "unknown key (did you mean loss.kl_beta?)"),
        ("learning_rate", "Input should be less than or equal to 1"),
        ("top_p", "Input should be greater than 0"),
        ("loss.kl_beta", "Input should be greater than or equal to 0"),
    ]
    assert str(err.value) == "stalenes: unknown key (did you mean staleness?) (and 4 more)"
    assert err.value.by_field()["top_p"] == ["Input should be greater than 0"]


def test_every_failing_cross_field_check_is_reported() -> None:
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(job(staleness=3, kappa=5, batch_trajectories=10, group_size=4))

    assert [field for field, _ in err.value.errors] == ["kappa", "batch_trajectories"]
    assert err.value.one_line() == ("kappa: must be < staleness S=3 (default S-1); "
                                    "batch_trajectories: R=10 must be a multiple of group_size n=4")


def test_the_learner_still_reads_the_sites_whole_job() -> None:
    """The site's job carries id, status and more; the learner validates it with JobSpec itself."""
    assert JobSpec.model_validate(job(id=7, status="running")).name == "tiny arithmetic"


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"staleness": 1}, "staleness", "greater than or equal to 2"),
        ({"staleness": 0}, "staleness", "greater than or equal to 2"),
        ({"staleness": 3, "kappa": 3}, "kappa", "must be < staleness S=3"),
        ({"staleness": 3, "kappa": 7}, "kappa", "must be < staleness S=3"),
        ({"kappa": 0}, "kappa", "greater than or equal to 1"),
        ({"batch_trajectories": 10, "group_size": 4}, "batch_trajectories",
         "R=10 must be a multiple of group_size n=4"),
        ({"batch_trajectories": 4, "group_size": 8}, "batch_trajectories", "multiple of group_size n=8"),
        ({"group_size": 1, "batch_trajectories": 8}, "group_size", "greater than or equal to 2"),
        ({"task": {"name": "chess"}}, "task", "unknown task 'chess'"),
        ({"task": {"name": "arithmetic", "modulus": 1}}, "task", "modulus"),
        ({"task": "arithmetic"}, "task", "dictionary"),
        ({"learning_rate": -0.001}, "learning_rate", "greater than 0"),
        ({"learning_rate": 0}, "learning_rate", "greater than 0"),
        ({"learning_rate": 2.0}, "learning_rate", "less than or equal to 1"),
        ({"clip_eps": 0}, "clip_eps", "greater than 0"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"name": ""}, "name", "at least 1 character"),
        ({"loss": {"max_grad_norm": 0}}, "loss.max_grad_norm", "greater than 0"),
        ({"snapshot_dtype": "fp16"}, "snapshot_dtype", "'bf16' or 'fp32'"),
        ({"snapshot_full_every": -1}, "snapshot_full_every", "greater than or equal to 0"),
    ],
)
def test_bad_field_is_named(changes: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(job(**changes))

    assert err.value.field == field
    assert words in err.value.message
    assert str(err.value) == f"{field}: {err.value.message}"
    assert not err.value.message.startswith("Value error")


def test_missing_required_field_is_named() -> None:
    raw = job()
    del raw["model_dir"]

    with pytest.raises(JobSpecError) as err:
        parse_job_spec(raw)

    assert err.value.field == "model_dir"
    assert err.value.message == "Field required"


@pytest.mark.parametrize("model_dir", ["meta-llama/Llama-3-8B", "Qwen/Qwen3-8B", "models/tiny", "~/models/tiny"])
def test_model_dir_is_a_path_on_the_learners_machine_not_a_hub_id(model_dir: str) -> None:
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(job(model_dir=model_dir))
    assert err.value.field == "model_dir" and "is not an absolute path" in err.value.message
    assert "hub id" in err.value.message


def test_a_model_dir_is_checked_for_a_checkpoint_on_this_machine(tmp_path, tiny_model_dir) -> None:
    assert model_dir_problem(str(tiny_model_dir)) is None
    assert model_dir_problem(str(tmp_path / "gone")) == f"no directory {tmp_path / 'gone'} on this machine"
    assert "has no config.json" in model_dir_problem(str(tmp_path))


def test_gradient_clipping_defaults_to_one_and_can_be_turned_off() -> None:
    assert parse_job_spec(job()).loss.max_grad_norm == 1.0
    assert parse_job_spec(job(loss={"max_grad_norm": None})).loss.max_grad_norm is None
    assert parse_job_spec(job(loss={"max_grad_norm": 0.5})).loss.max_grad_norm == 0.5


def test_loss_defaults_are_resolved_from_the_job() -> None:
    spec = parse_job_spec(job(clip_eps=0.3, max_new_tokens=6))
    loss = spec.loss
    assert (loss.type, loss.off_policy, loss.aggregation) == ("grpo", "behaviour", "token-mean")
    assert (loss.clip_eps_low, loss.clip_eps_high, loss.kl_beta, loss.norm_length) == (0.3, 0.3, 0.0, 6)

    gspo = parse_job_spec(job(clip_eps=0.3, loss={"type": "gspo", "clip_eps_high": 0.4, "norm_length": 16})).loss
    assert (gspo.aggregation, gspo.clip_eps_low, gspo.clip_eps_high, gspo.norm_length) == (
        "seq-mean-token-mean", 0.3, 0.4, 16)
    assert parse_job_spec(job(loss={"clip_eps_low": 0.1})).loss.clip_eps_high == 0.1  # high follows low


def test_a_resolved_job_reads_back_the_same() -> None:
    """The site stores the resolved spec; the learner parses it again and must get the very same job."""
    spec = parse_job_spec(job(clip_eps=0.25, loss={"type": "gspo"}))
    assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_a_clip_eps_that_cannot_be_the_lower_clip_range_is_refused() -> None:
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(job(clip_eps=1.5))
    assert err.value.field == "clip_eps" and "loss.clip_eps_low" in err.value.message
    assert parse_job_spec(job(clip_eps=1.5, loss={"clip_eps_low": 0.2})).loss.clip_eps_high == 0.2
