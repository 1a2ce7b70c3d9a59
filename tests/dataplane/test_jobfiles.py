"""Job files (TOML, YAML) and ``--set`` overrides become the raw settings ``parse_job_spec`` checks; a resolved
spec written back as TOML or YAML reads back as the same spec."""

from __future__ import annotations

import pytest

from dataplane.jobfiles import (
    JobFileError,
    apply_overrides,
    dump_toml,
    dump_yaml,
    load_job_file,
    parse_value,
    read_job_text,
)
from dataplane.jobs import parse_job_spec

TOML = """
name = "tiny arithmetic"
model_dir = "/models/tiny"
staleness = 4
batch_trajectories = 64

[task]
name = "arithmetic"
max_operand = 9

[loss]
kl_beta = 0.02
"""

YAML = """
name: tiny arithmetic
model_dir: /models/tiny
staleness: 4
batch_trajectories: 64
task: {name: arithmetic, max_operand: 9}
loss:
  kl_beta: 0.02
"""


def test_the_same_job_as_toml_and_as_yaml_is_the_same_spec(tmp_path) -> None:
    (tmp_path / "job.toml").write_text(TOML)
    (tmp_path / "job.yml").write_text(YAML)

    from_toml = parse_job_spec(load_job_file(tmp_path / "job.toml"))
    from_yaml = parse_job_spec(load_job_file(tmp_path / "job.yml"))

    assert from_toml == from_yaml
    assert (from_toml.staleness, from_toml.kappa, from_toml.loss.kl_beta) == (4, 3, 0.02)


@pytest.mark.parametrize(("name", "text", "words"), [
    ("job.toml", "name = ", "job.toml: not valid TOML"),
    ("job.yaml", "name: [unclosed", "job.yaml: not valid YAML"),
    ("job.yaml", "- a list", "must be a mapping of job settings"),
    ("job.json", "{}", "a job file is .toml, .yaml or .yml"),
])
def test_an_unreadable_job_file_is_one_line_naming_the_file(tmp_path, name: str, text: str, words: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(JobFileError) as err:
        load_job_file(tmp_path / name)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("text", "value"), [
    ("0.05", 0.05), ("4", 4), ("true", True), ('"4"', "4"), ("math", "math"), ("null", None),
    ("[1, 2]", [1, 2]), ('{name = "math"}', {"name": "math"}), ('{"name": "math"}', {"name": "math"}),
])
def test_override_values_are_toml_or_json_scalars_else_text(text: str, value) -> None:
    assert parse_value(text) == value


def test_dotted_overrides_reach_into_tables_and_leave_the_file_alone() -> None:
    raw = read_job_text(TOML, kind="toml")

    out = apply_overrides(raw, ["loss.kl_beta=0.05", "staleness=6", "loss.type=gspo", "task.name=countdown"])

    assert out["loss"] == {"kl_beta": 0.05, "type": "gspo"}
    assert (out["staleness"], out["task"]["name"]) == (6, "countdown")
    assert raw["loss"] == {"kl_beta": 0.02}


@pytest.mark.parametrize(("item", "words"), [
    ("staleness", "expected KEY=VALUE"), ("=4", "expected KEY=VALUE"), ("loss..x=1", "expected KEY=VALUE"),
    ("name.first=x", "name is not a table"),
])
def test_a_malformed_override_is_refused(item: str, words: str) -> None:
    with pytest.raises(JobFileError) as err:
        apply_overrides(read_job_text(TOML, kind="toml"), [item])
    assert words in str(err.value)


def test_a_misspelt_override_is_refused_like_a_misspelt_key() -> None:
    raw = apply_overrides(read_job_text(TOML, kind="toml"), ["loss.kl_bta=0.05"])
    with pytest.raises(ValueError, match=r"loss.kl_bta: unknown key \(did you mean loss.kl_beta\?\)"):
        parse_job_spec(raw)


@pytest.mark.parametrize("kind", ["toml", "yaml"])
def test_a_resolved_spec_written_out_reads_back_as_the_same_spec(kind: str) -> None:
    spec = parse_job_spec(apply_overrides(read_job_text(TOML, kind="toml"), [
        'name="quote \\" and ü"', "target_reward=0.9"]))
    data = spec.model_dump(mode="json")

    text = dump_toml(data) if kind == "toml" else dump_yaml(data)

    assert parse_job_spec(read_job_text(text, kind=kind)) == spec


def test_toml_has_no_null_so_a_null_setting_is_a_comment_saying_how_to_set_it() -> None:
    text = dump_toml({"name": "x", "loss": {"max_grad_norm": None, "kl_beta": 0.0}})
    assert "# max_grad_norm = null  (TOML has no null: --set loss.max_grad_norm=null)" in text
    assert read_job_text(text, kind="toml") == {"name": "x", "loss": {"kl_beta": 0.0}}
