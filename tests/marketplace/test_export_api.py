"""``GET /api/jobs/<id>/export/`` against a real learner snapshot server (learner/serving.py) holding a trained
tiny model: the owner gets a Hugging Face directory in a tar that ``from_pretrained`` loads with the snapshot's
tensors; anyone else gets a 404 (staff a 403); an unknown or pruned version a 404 with the reason; a learner
that is gone a 503 naming the offline command. Also over ASGI (daphne's path), where the archive is streamed."""

from __future__ import annotations

import io
import shutil

import pytest
import torch
from django.test import AsyncClient
from rest_framework.test import APIClient
from safetensors.torch import load_file

from dataplane import export
from dataplane.broadcast.store import read_manifest, version_dir
from learner.serving import SnapshotServer
from marketplace.models import Snapshot

from ..learner.helpers import trained_snapshots
from . import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def published(tiny_model_dir, tmp_path):
    """A job of its owner whose learner serves the base (v0) and a trained v2."""
    owner = factories.user("owner")
    job = factories.job(owner, model_dir=str(tiny_model_dir))
    model, store = trained_snapshots(tiny_model_dir, tmp_path / "snapshots" / f"job{job.pk}", job.pk)
    server = SnapshotServer(store, secret=job.transfer_secret).start()
    for version in (0, 2):
        Snapshot.objects.create(job=job, version=version, url=server.url_for(version),
                                manifest=read_manifest(store.root, version).model_dump(mode="json"))
    yield owner, job, model, store, server
    server.stop()  # a second stop (a test stopped it) returns at once


def client_for(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(user)}")
    return api


def test_the_owner_downloads_a_model_that_from_pretrained_loads(published, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    owner, job, model, _, _ = published
    reply = client_for(owner).get(f"/api/jobs/{job.pk}/export/")  # the newest: v2

    assert reply.status_code == 200
    assert reply["Content-Type"] == "application/x-tar" and reply["X-Echo2-Version"] == "2"
    assert reply["Content-Disposition"] == f'attachment; filename="job{job.pk}-v2.tar"'
    body = b"".join(reply.streaming_content)
    assert len(body) == int(reply["Content-Length"])
    names = export.unpack(io.BytesIO(body), tmp_path / "out")
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(names)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_bf16_and_the_base_version(published, tmp_path) -> None:
    owner, job, model, _, _ = published
    api = client_for(owner)
    bf16 = api.get(f"/api/jobs/{job.pk}/export/", {"version": "2", "dtype": "bf16"})
    assert bf16.status_code == 200 and bf16["X-Echo2-Dtype"] == "bf16"
    export.unpack(io.BytesIO(b"".join(bf16.streaming_content)), tmp_path / "bf16")
    assert load_file(tmp_path / "bf16" / "model.safetensors")["model.norm.weight"].dtype == torch.bfloat16

    base = api.get(f"/api/jobs/{job.pk}/export/", {"version": "0"})
    assert base.status_code == 200 and base["Content-Disposition"].endswith(f'job{job.pk}-v0.tar"')


def test_nobody_else_gets_the_weights(published) -> None:
    _, job, _, _, _ = published
    stranger = client_for(factories.user("stranger")).get(f"/api/jobs/{job.pk}/export/")
    assert stranger.status_code == 404
    staff = client_for(factories.user("admin", is_staff=True)).get(f"/api/jobs/{job.pk}/export/")
    assert staff.status_code == 403 and staff.json()["detail"] == "only the job's owner may export its weights"
    assert APIClient().get(f"/api/jobs/{job.pk}/export/").status_code == 401


@pytest.mark.parametrize(("query", "code", "detail"), [
    ({"version": "7"}, 404, "job {job} has no snapshot version 7 (published: 0, 2)"),
    ({"version": "-1"}, 400, "version: must be a non-negative integer"),
    ({"dtype": "fp8"}, 400, "dtype: must be one of as-trained, bf16"),
    ({"version": "0", "dtype": "bf16"}, 400, "dtype: version 0 is the base model as published; it is exported "
                                              "unchanged"),
])
def test_bad_requests_get_the_reason(published, query, code, detail) -> None:
    owner, job, _, _, _ = published
    reply = client_for(owner).get(f"/api/jobs/{job.pk}/export/", query)
    assert reply.status_code == code
    assert reply.json()["detail"] == detail.format(job=job.pk)


def test_a_pruned_version_and_a_stopped_learner_say_what_to_do(published) -> None:
    owner, job, _, store, server = published
    api = client_for(owner)
    shutil.rmtree(version_dir(store.root, 2))
    pruned = api.get(f"/api/jobs/{job.pk}/export/", {"version": "2"})
    assert pruned.status_code == 404
    assert pruned.json()["detail"].startswith(f"version 2 of job {job.pk} is no longer on its learner")

    server.stop()
    gone = api.get(f"/api/jobs/{job.pk}/export/", {"version": "0"})
    assert gone.status_code == 503
    assert f"`echo2-learner export --job {job.pk} --version 0 --out DIR`" in gone.json()["detail"]


@pytest.mark.django_db(transaction=True)
async def test_over_asgi_the_archive_streams(published, tmp_path) -> None:
    from asgiref.sync import sync_to_async

    owner, job, model, _, _ = published
    token = await sync_to_async(factories.token)(owner)
    reply = await AsyncClient().get(f"/api/jobs/{job.pk}/export/", headers={"Authorization": f"Token {token}"})

    assert reply.status_code == 200 and reply.is_async
    body = b"".join([piece async for piece in reply.streaming_content])
    assert len(body) == int(reply["Content-Length"])
    export.unpack(io.BytesIO(body), tmp_path / "out")
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert torch.equal(written["model.norm.weight"], model.state_dict()["model.norm.weight"])


def test_the_dashboard_link_works_with_the_owners_session(published) -> None:
    from django.test import Client

    owner, job, _, _, _ = published
    browser = Client()
    browser.force_login(owner)
    reply = browser.get(f"/api/jobs/{job.pk}/export/", {"version": "2", "dtype": "bf16"})
    assert reply.status_code == 200 and reply["X-Echo2-Dtype"] == "bf16"
    assert len(b"".join(reply.streaming_content)) == int(reply["Content-Length"])


def test_a_version_published_as_a_delta_exports_its_full_payload(tiny_model_dir, tmp_path) -> None:
    from learner.snapshots import SnapshotStore, publishable_state

    owner = factories.user("owner")
    job = factories.job(owner, model_dir=str(tiny_model_dir))
    model, store = trained_snapshots(tiny_model_dir, tmp_path / "fp32", job.pk)
    store = SnapshotStore(tmp_path / "snapshots" / f"job{job.pk}", job_id=job.pk, chunk_bytes=4096)  # bf16, deltas
    store.write_base(tiny_model_dir)
    store.write(model, 1)
    with torch.no_grad():
        model.model.norm.weight.add_(0.5)
    assert store.write(model, 2).kind == "delta"
    server = SnapshotServer(store, secret=job.transfer_secret).start()
    try:
        for version in (0, 1, 2):
            Snapshot.objects.create(job=job, version=version, url=server.url_for(version),
                                    manifest=read_manifest(store.root, version).model_dump(mode="json"))
        reply = client_for(owner).get(f"/api/jobs/{job.pk}/export/", {"version": "2"})
        assert reply.status_code == 200, reply.content
        export.unpack(io.BytesIO(b"".join(reply.streaming_content)), tmp_path / "out")
    finally:
        server.stop()
    written = load_file(tmp_path / "out" / "model.safetensors")
    for name, tensor in publishable_state(model).items():
        assert torch.equal(written[name], tensor.bfloat16()), name


def test_a_chat_jobs_export_prompts_with_its_system_prompt(tiny_model_dir, tmp_path) -> None:
    """The job's system prompt is the exported chat template's default: apply_chat_template on the user's message
    alone gives what the engines prompted with (dataplane/chat.py)."""
    from transformers import AutoTokenizer

    from dataplane.chat import PromptFormat, prompt_ids

    model_dir = tmp_path / "chat-model"
    shutil.copytree(tiny_model_dir, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}={% endfor %}"
    tokenizer.save_pretrained(model_dir)
    owner = factories.user("owner")
    job = factories.job(owner, model_dir=str(model_dir))
    fmt = PromptFormat(chat=True, system_prompt="12")
    job.spec = {**job.spec, "prompt_format": fmt.model_dump()}
    job.save()
    _, store = trained_snapshots(model_dir, tmp_path / "snapshots" / f"job{job.pk}", job.pk)
    server = SnapshotServer(store, secret=job.transfer_secret).start()
    try:
        for version in (0, 2):
            Snapshot.objects.create(job=job, version=version, url=server.url_for(version),
                                    manifest=read_manifest(store.root, version).model_dump(mode="json"))
        reply = client_for(owner).get(f"/api/jobs/{job.pk}/export/")
        assert reply.status_code == 200
        export.unpack(io.BytesIO(b"".join(reply.streaming_content)), tmp_path / "out")
    finally:
        server.stop()
    exported = AutoTokenizer.from_pretrained(tmp_path / "out")
    user = [{"role": "user", "content": "3+4"}]
    assert exported.apply_chat_template(user, tokenize=False, add_generation_prompt=True) == "12=3+4="
    assert exported.apply_chat_template(user, add_generation_prompt=True, return_dict=True)["input_ids"] == \
        prompt_ids(tokenizer, "3+4", fmt)
