"""``echo2 job export`` against a live site and a real learner snapshot server: the owner's directory loads with
``from_pretrained``; an unknown version, a stranger's job and a used --out are each one line and a non-zero exit."""

from __future__ import annotations

import json

import pytest
import torch

from ..marketplace import factories
from ..marketplace.test_export_api import published  # noqa: F401 - the fixture
from .test_cli import echo2, one_line_error


@pytest.fixture
def env(live_server, published, tmp_path):  # noqa: F811 - the fixture
    owner, job, model, _, _ = published
    token_file = tmp_path / "token"
    token_file.write_text(factories.token(owner) + "\n")
    token_file.chmod(0o600)
    return {"ECHO2_SERVER": live_server.url, "ECHO2_TOKEN_FILE": str(token_file)}, job, model


@pytest.mark.django_db(transaction=True)
def test_the_owner_exports_a_loadable_directory(env, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    variables, job, model = env
    done = echo2("job", "export", str(job.pk), "--out", str(tmp_path / "out"), "--json", env=variables)

    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout)
    assert written["version"] == 2 and written["dtype"] == "as-trained" and written["out"] == str(tmp_path / "out")
    assert written["files"]["model.safetensors"] == (tmp_path / "out" / "model.safetensors").stat().st_size
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name

    human = echo2("job", "export", str(job.pk), "--version", "2", "--bf16", "--out", str(tmp_path / "bf16"),
                  env=variables)
    assert human.returncode == 0, human.stderr
    assert human.stdout.startswith(f"job {job.pk} v2 (bf16) exported to {tmp_path / 'bf16'}: config.json, ")


@pytest.mark.django_db(transaction=True)
def test_refusals_are_one_line(env, tmp_path) -> None:
    variables, job, _ = env
    unknown = echo2("job", "export", str(job.pk), "--version", "9", "--out", str(tmp_path / "a"), env=variables)
    assert one_line_error(unknown, 1) == (f"GET /api/jobs/{job.pk}/export/: job {job.pk} has no snapshot version 9 "
                                          "(published: 0, 2)")
    assert not (tmp_path / "a").exists()

    other = factories.user("other")
    other_job = factories.job(other)
    stranger = echo2("job", "export", str(other_job.pk), "--out", str(tmp_path / "b"), env=variables)
    assert one_line_error(stranger, 1) == (f"GET /api/jobs/{other_job.pk}/export/: not found (no such job, or "
                                           "not yours)")

    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    used = echo2("job", "export", str(job.pk), "--out", str(tmp_path / "used"), env=variables)
    assert one_line_error(used, 2) == f"--out: {tmp_path / 'used'} exists and is not an empty directory"
