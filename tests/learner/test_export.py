"""A trained tiny model's snapshot, exported from the learner's snapshot directory, is a Hugging Face directory
that ``AutoModelForCausalLM``/``AutoTokenizer.from_pretrained`` load as is and generate with, holding exactly
the snapshot's tensors (as trained, or cast to bf16); the checkpoint's model exports the same way."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load, load_file
from typer.testing import CliRunner

from dataplane import export
from dataplane.broadcast.store import read_version, version_dir
from dataplane.snapshot import assemble
from learner.checkpoint import Checkpoint, CheckpointStore
from learner.cli import app
from learner.export import export_checkpoint, export_version
from learner.snapshots import SnapshotStore

from ..worker_agent.test_engine_vllm import needs_vllm_gpu
from .helpers import trained_snapshots

JOB = 5


@pytest.fixture
def trained(tiny_model_dir, tmp_path):
    return trained_snapshots(tiny_model_dir, tmp_path / "snapshots" / f"job{JOB}", JOB)


def snapshot_tensors(store: SnapshotStore, version: int) -> dict[str, torch.Tensor]:
    manifest, chunks = read_version(version_dir(store.root, version))
    return load(assemble(manifest, chunks))


def test_an_exported_snapshot_loads_with_from_pretrained_and_generates(trained, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, store = trained
    written = export_version(tmp_path / "snapshots", JOB, tmp_path / "out")  # the newest: version 2

    assert written["version"] == 2 and written["dtype"] == "as-trained"
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "model.safetensors"} <= set(p.name for p in (tmp_path / "out").iterdir())
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "float32"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    snapshot, state = snapshot_tensors(store, 2), loaded.state_dict()
    assert set(snapshot) <= set(state)
    for name, tensor in snapshot.items():
        assert torch.equal(state[name], tensor), name
        assert torch.equal(tensor, model.state_dict()[name]), name
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])  # tied again
    inputs = tokenizer("3+4=", return_tensors="pt")
    out = loaded.generate(**inputs, max_new_tokens=3, do_sample=False, min_new_tokens=3)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 3
    assert isinstance(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:]), str)


def test_a_bf16_export_holds_the_snapshot_cast_to_bf16(trained, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    _, store = trained
    export_version(tmp_path / "snapshots", JOB, tmp_path / "out", version=2, dtype="bf16")

    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    written = load_file(tmp_path / "out" / "model.safetensors")
    for name, tensor in snapshot_tensors(store, 2).items():
        assert written[name].dtype == torch.bfloat16 and torch.equal(written[name], tensor.to(torch.bfloat16)), name
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out").dtype == torch.bfloat16


def test_only_the_base_chunks_holding_config_and_tokenizer_are_read(trained, tmp_path) -> None:
    _, store = trained
    base, fetch_base = export.local_version(store.root, 0)
    snapshot, fetch = export.local_version(store.root, 2)
    read = []
    members = export.plan(base, lambda i: read.append(i) or fetch_base(i), snapshot, fetch)

    assert [m.name for m in members][0] == "config.json" and members[-1].name == "model.safetensors"
    assert "model.safetensors" not in [m.name for m in members[:-1]]  # the base's weights are not exported
    assert len(set(read)) < len(base.chunks) // 2  # the base's weights were skipped, not downloaded


def test_version_0_is_the_base_unchanged(trained, tiny_model_dir, tmp_path) -> None:
    export_version(tmp_path / "snapshots", JOB, tmp_path / "out", version=0)
    for path in tiny_model_dir.iterdir():
        assert (tmp_path / "out" / path.name).read_bytes() == path.read_bytes(), path.name
    with pytest.raises(export.ExportError, match="version 0 is the base model"):
        export_version(tmp_path / "snapshots", JOB, tmp_path / "out-bf16", version=0, dtype="bf16")


def test_the_checkpoint_exports_the_final_model(trained, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    model, _ = trained
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)  # a step after the last publication
    CheckpointStore(tmp_path / "snapshots" / f"job{JOB}-checkpoint").save(Checkpoint(
        version=3, model=model.state_dict(), optimizer={}, rng={}, trained_entry_ids=[], job={"job_id": JOB}))

    written = export_checkpoint(tmp_path / "snapshots", JOB, tmp_path / "out")

    assert written["version"] == 3
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_a_sharded_checkpoint_exports_the_final_model(trained, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from learner import fsdp

    model, _ = trained
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    store = CheckpointStore(tmp_path / "snapshots" / f"job{JOB}-checkpoint")
    path = store.fresh_sharded_dir(3)  # as an FSDP learner's ranks write it (here one process)
    fsdp.save_sharded(model, torch.optim.AdamW(model.parameters()), path)
    store.save(Checkpoint(version=3, model={}, optimizer={}, rng={}, trained_entry_ids=[], job={"job_id": JOB},
                          sharded=path.name))

    assert export_checkpoint(tmp_path / "snapshots", JOB, tmp_path / "out")["version"] == 3
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_echo2_learner_export_prints_what_it_wrote_or_one_line(trained, tmp_path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["export", "--job", str(JOB), "--snapshot-dir", str(tmp_path / "snapshots"),
                             "--version", "2", "--out", str(tmp_path / "out")])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["files"]["model.safetensors"] > 0

    missing = runner.invoke(app, ["export", "--job", str(JOB), "--snapshot-dir", str(tmp_path / "snapshots"),
                                  "--version", "7", "--out", str(tmp_path / "out7")])
    assert missing.exit_code == 1
    assert missing.stderr.strip().splitlines() == [
        f"echo2-learner: error: job {JOB} has no version 7 in {tmp_path / 'snapshots' / f'job{JOB}'}; on disk: 0, 2 "
        "(the learner keeps the base, the newest S+2 and those of the last --snapshot-retain seconds)"]
    again = runner.invoke(app, ["export", "--job", str(JOB), "--snapshot-dir", str(tmp_path / "snapshots"),
                                "--out", str(tmp_path / "out")])
    assert again.exit_code == 1 and "exists and is not an empty directory" in again.stderr


def test_the_checkpoint_directory_does_not_pass_for_a_model(tmp_path) -> None:
    # Its run configuration was config.json, so from_pretrained took the directory for a model without a
    # model_type ("Unrecognized model"); now it is run-config.json, and an old one is removed.
    (tmp_path / "config.json").write_text(json.dumps({"job": {}, "learner": {}}))
    CheckpointStore(tmp_path).save_config({"job": {}, "learner": {}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-config.json"]


def test_the_bf16_cast_rounds_as_torch_does() -> None:
    from dataplane.weights import _to_bf16

    special = torch.tensor([0.0, -0.0, 1.0, -1.5, float("inf"), float("-inf"), float("nan"), 3.4e38, 1e-40,
                            1.00390625, 1.01171875, 1.0 + 2**-8 + 2**-20])  # ties to even, subnormals, overflow
    values = torch.cat([special, torch.randn(10_000) * 1e3])
    for dtype in (torch.float32, torch.float16, torch.float64):
        source = values.to(dtype)
        ours = torch.frombuffer(bytearray(_to_bf16(source.numpy().tobytes(), {
            torch.float32: "F32", torch.float16: "F16", torch.float64: "F64"}[dtype])), dtype=torch.bfloat16)
        theirs = source.to(torch.bfloat16)
        same = (ours.view(torch.int16) == theirs.view(torch.int16)) | (ours.isnan() & theirs.isnan())
        assert bool(same.all()), (dtype, values[~same][:5])


@needs_vllm_gpu
def test_vllm_loads_an_exported_snapshot_as_is(tmp_path) -> None:
    """vLLM's own loader on an exported directory (config, tokenizer, model.safetensors), fp32 and bf16: it builds
    the model and generates. (Head size 64 and up: vLLM's attention kernels take no smaller.)"""
    from vllm import LLM, SamplingParams

    from dataplane.tasks import build_task
    from learner.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "base", alphabet=build_task({"name": "arithmetic"}).alphabet,
                                 hidden=256, layers=2, heads=4)
    trained_snapshots(model_dir, tmp_path / "snapshots" / f"job{JOB}", JOB)
    for dtype, torch_dtype in (("as-trained", "float32"), ("bf16", "bfloat16")):
        out = tmp_path / dtype
        export_version(tmp_path / "snapshots", JOB, out, version=2, dtype=dtype)
        llm = LLM(model=str(out), dtype=torch_dtype, enforce_eager=True, gpu_memory_utilization=0.2, seed=0)
        completions = llm.generate(["3+4="], SamplingParams(max_tokens=3, temperature=0.0, min_tokens=3))
        assert len(completions[0].outputs[0].token_ids) == 3
        del llm
