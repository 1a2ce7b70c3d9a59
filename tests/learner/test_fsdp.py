"""FSDP (learner/fsdp.py): two CPU ranks over gloo under torchrun take the same updates as one process, their
sharded checkpoint continues on one process, a single-process checkpoint continues on sharded ranks, and bf16
mixed precision trains with finite numbers. The same on NCCL where a GPU is present."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from dataplane.jobs import JobSpec
from learner import fsdp
from learner.checkpoint import Checkpoint, CheckpointStore
from learner.policy import build_policy
from learner.snapshots import SnapshotStore
from learner.step import PolicyTrainer

from .ddp_step import batches
from .helpers import loss_config
from .test_distributed import BIN, run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "tests.learner.fsdp_step"]


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _torchrun(model_dir: Path, out: Path, *args: str, ranks: int = 2):
    result = run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(ranks), *SCRIPT, str(model_dir),
                  str(out), *args], _env())
    assert result.returncode == 0, result.stderr[-3000:]


def _alone(model_dir: Path, out: Path, *args: str):
    result = run([sys.executable, *SCRIPT, str(model_dir), str(out), *args], _env())
    assert result.returncode == 0, result.stderr[-3000:]


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert got.keys() == want.keys(), what
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=2e-6, msg=lambda m, n=name: f"{what}, {n}: {m}")


@pytest.mark.slow
def test_two_fsdp_ranks_equal_one_process_and_checkpoints_cross_world_sizes(tmp_path, tiny_model_dir) -> None:
    _alone(tiny_model_dir, tmp_path, "--mode", "reference")
    # micro-batches of one row: rank 0 has 5 rows of A and rank 1 4, so rank 1 pairs its last pass with a row of
    # weight 0; activations recomputed in the backward
    _torchrun(tiny_model_dir, tmp_path, "--mode", "fsdp", "--micro-batch", "1", "--activation-checkpointing")
    _alone(tiny_model_dir, tmp_path, "--mode", "resume")

    reference = torch.load(tmp_path / "reference.pt")
    base = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert reference.keys() == base.keys()  # the tied output layer published once, as before
    assert any(not torch.equal(reference[k], base[k]) for k in base), "the updates changed nothing"
    fsdp = torch.load(tmp_path / "fsdp.pt")
    assert fsdp["ranks"] == 2 and fsdp["sharded"]
    _assert_close(fsdp["continued"], reference, "2 FSDP ranks")
    _assert_close(fsdp["from_whole"], reference, "a 1-process checkpoint resumed on 2 FSDP ranks")
    _assert_close(torch.load(tmp_path / "resumed.pt"), reference, "a 2-rank sharded checkpoint resumed on 1 process")
    checkpoint, shards = sorted((tmp_path / "sharded").iterdir())  # checkpoint.pt names the directory of shards
    assert checkpoint.name == "checkpoint.pt" and shards.name.startswith("sharded-v00000001-")
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # each rank's


@pytest.mark.slow
def test_bf16_mixed_precision_trains_finite(tmp_path, tiny_model_dir) -> None:
    _torchrun(tiny_model_dir, tmp_path, "--mode", "bf16")
    out = torch.load(tmp_path / "bf16.pt")
    base = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert all(torch.isfinite(torch.tensor(v)) for v in out["losses"] + out["grad_norms"]), out
    assert all(n > 0 for n in out["grad_norms"])
    for name, tensor in out["weights"].items():
        assert tensor.dtype == torch.float32, f"{name}: the master weights stay fp32"
        assert torch.isfinite(tensor).all(), name
    assert any(not torch.equal(out["weights"][k], base[k]) for k in base), "the updates changed nothing"
    assert (tmp_path / "bf16-sharded" / "checkpoint.pt").is_file()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_fsdp_on_nccl_in_bf16(tmp_path, tiny_model_dir) -> None:
    _torchrun(tiny_model_dir, tmp_path, "--mode", "bf16", "--device", "cuda")
    out = torch.load(tmp_path / "bf16.pt")
    assert all(torch.isfinite(torch.tensor(v)) for v in out["losses"] + out["grad_norms"]), out
    assert all(torch.isfinite(t).all() for t in out["weights"].values())


# --- in one process: the checkpoint formats and the tensor-by-tensor weights ---------------------------------

def _policy(model_dir: Path):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), loss_config(), pad_id=0)


def test_a_sharded_checkpoint_loads_into_a_fresh_policy_and_replaces_the_older_one(tmp_path, tiny_model_dir) -> None:
    trainer = _policy(tiny_model_dir)
    a, _ = batches(AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer.step(a)
    store = CheckpointStore(tmp_path / "ckpt")
    store.save(Checkpoint(version=1, **trainer.checkpoint_state(store, 1), rng={}, trained_entry_ids=[], job={}))
    first = store.load().sharded
    path = store.fresh_sharded_dir(2)  # what any world size writes, here one process without a process group
    fsdp.save_sharded(trainer.module, trainer.optimizer, path)
    store.save(Checkpoint(version=2, model={}, optimizer={}, rng={}, trained_entry_ids=["2-0"], job={},
                          sharded=path.name))
    assert first is None and sorted(p.name for p in store.root.iterdir()) == ["checkpoint.pt", path.name]

    fresh = _policy(tiny_model_dir)
    ckpt = store.load()
    assert (ckpt.version, ckpt.model, ckpt.trained_entry_ids) == (2, {}, ["2-0"])
    fresh.load_state(ckpt.model, ckpt.optimizer, sharded=store.sharded_path(ckpt))
    for name, tensor in trainer.module.state_dict().items():
        assert torch.equal(fresh.module.state_dict()[name], tensor), name
    want, got = trainer.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    assert want.keys() == got.keys()
    assert all(torch.equal(got[i][k], want[i][k]) for i in want for k in want[i])

    for stray in path.glob("*.distcp"):  # a directory not written by every rank (not on a shared filesystem)
        stray.unlink()
    (path / ".metadata").unlink()
    with pytest.raises(FileNotFoundError, match="not a sharded checkpoint"):
        fresh.load_state({}, {}, sharded=path)
    shutil.rmtree(path)
    with pytest.raises(ValueError, match="names the sharded checkpoint .* which is missing"):
        store.load()


def test_a_checkpoint_of_an_unknown_format_is_refused(tmp_path) -> None:
    store = CheckpointStore(tmp_path)
    torch.save({"format": 7}, store.path)
    with pytest.raises(ValueError, match="not a checkpoint of format 1 or 2 \\(found 7\\)"):
        store.load()


def test_full_state_gives_the_published_weights_tensor_by_tensor(tiny_model_dir, tmp_path) -> None:
    trainer = _policy(tiny_model_dir)
    names = [name for name, _ in trainer.full_state()]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names  # tied: once
    gathered = SnapshotStore(tmp_path / "gathered", job_id=1).write(trainer.full_state(), 1)
    whole = SnapshotStore(tmp_path / "whole", job_id=1).write(trainer.module, 1)
    assert gathered == whole  # the same payload, byte for byte, whichever way the tensors came
    assert load((tmp_path / "gathered" / "v1" / "chunks" / "0").read_bytes()).keys() == set(names)


def test_an_unknown_parallel_mode_is_refused(tiny_model_dir) -> None:
    spec = JobSpec(name="p", model_dir=str(tiny_model_dir), task={"name": "arithmetic"})
    with pytest.raises(ValueError, match="parallel must be one of ddp, fsdp, got 'tp'"):
        build_policy(spec, device="cpu", parallel="tp")
