"""``echo2-learner export``: a job's model as a Hugging Face directory, from the learner's own disk.

The offline path beside the site's ``GET /api/jobs/<id>/export/`` (which needs the learner running to serve
its snapshots): it reads the snapshot directory the learner wrote (``<snapshot-dir>/job<ID>``), so it works
after the job ended, with the site down, or for a version the site was never told of. ``--checkpoint``
exports the weights of the last checkpoint instead of a published version: the final model of a job whose
last steps were not published. The files are those of :mod:`dataplane.export`; the job's prompt format, which
shapes the exported chat template, is read from the run configuration the learner saved beside its checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save

from dataplane import export
from dataplane.broadcast.store import list_versions
from dataplane.chat import PLAIN, PromptFormat, as_prompt_format
from dataplane.lora import ADAPTER_FORMAT
from dataplane.snapshot import build_manifest, split

from . import fsdp
from .checkpoint import CheckpointStore


def tensors_bytes(state: dict[str, torch.Tensor]) -> bytes:
    """A state dict as one safetensors file, as ``save_pretrained`` writes one: ``{"format": "pt"}`` metadata,
    and of tensors sharing storage (tied embeddings) only the first, which the loader re-ties."""
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    seen: dict[int, str] = {}
    for name in list(cpu):
        ptr = state[name].data_ptr()  # the originals: a copy to the CPU would give each its own storage
        if ptr in seen:
            del cpu[name]
        else:
            seen[ptr] = name
    return save(cpu, metadata={"format": "pt"})


def job_store(snapshot_dir: Path, job_id: int) -> Path:
    """Where the learner of ``job_id`` writes its versions (learner/trainer.py)."""
    root = Path(snapshot_dir) / f"job{job_id}"
    if not root.is_dir():
        raise export.ExportError(f"no snapshots of job {job_id} in {snapshot_dir} (give the learner's --snapshot-dir)")
    return root


def saved_prompt_format(snapshot_dir: Path, job_id: int, checkpoint_dir: Path | None = None) -> PromptFormat:
    """Job ``job_id``'s prompt format, from the run configuration its learner saved (``run-config.json`` in
    ``checkpoint_dir``, by default ``<snapshot-dir>/job<ID>-checkpoint``); plain where there is none (a learner
    from before the setting: every job was plain)."""
    path = Path(checkpoint_dir or Path(snapshot_dir) / f"job{job_id}-checkpoint") / "run-config.json"
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return PLAIN
    except (OSError, ValueError) as err:
        raise export.ExportError(f"{path}: {err}") from None
    try:
        return as_prompt_format((saved.get("job") or {}).get("prompt_format"))
    except ValueError as err:
        raise export.ExportError(f"{path}: job.prompt_format: {err}") from None


def export_version(snapshot_dir: Path, job_id: int, out: Path, *, version: int | None = None,
                   dtype: str = "as-trained", prompt_format: PromptFormat | None = None, merged: bool = False) -> dict:
    """Write version ``version`` (default: the newest on disk) of job ``job_id`` to ``out``, its tokenizer as
    ``prompt_format`` (default: the saved one) prompted it; returns what was written (job, version, dtype,
    prompt format, directory, files). A LoRA job's version is the base with the adapter beside it
    (dataplane/export.py), or with ``merged`` the adapter merged into the base's weights (:func:`merge_adapter`)."""
    root = job_store(snapshot_dir, job_id)
    held = list_versions(root)
    if version is None:
        version = held[-1] if held else 0
    if version not in held:
        raise export.ExportError(f"job {job_id} has no version {version} in {root}; on disk: "
                                 f"{', '.join(map(str, held)) or 'none'} (the learner keeps the base, the newest "
                                 "S+2 and those of the last --snapshot-retain seconds)")
    base, fetch_base = export.local_version(root, 0)
    snapshot, fetch = export.local_version(root, version)
    fmt = prompt_format or saved_prompt_format(snapshot_dir, job_id)
    members = export.plan(base, fetch_base, snapshot, fetch, dtype=dtype, prompt_format=fmt)
    if merged and snapshot.format != ADAPTER_FORMAT:
        raise export.ExportError(f"--merged: version {version} is not a LoRA adapter (merged already)")
    written = _written(job_id, version, dtype, export.write_directory(members, out), members, fmt)
    if merged:
        written["files"] = merge_adapter(out)
    return written


def merge_adapter(directory: Path) -> dict[str, int]:
    """Turn the export of a LoRA version in ``directory`` (the base's files and the adapter's) into one plain model:
    the adapter merged into the base's weights with PEFT (``merge_and_unload``), written by ``save_pretrained`` in
    the base's dtype, the adapter's files removed; returns the files and their sizes."""
    import tempfile

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    with tempfile.TemporaryDirectory(dir=directory.parent) as aside:
        base_dir, adapter_dir = Path(aside, "base"), Path(aside, "adapter")
        base_dir.mkdir()
        adapter_dir.mkdir()
        for name in (export.ADAPTER_WEIGHTS, export.ADAPTER_CONFIG):  # apart: from_pretrained would apply it itself
            (directory / name).rename(adapter_dir / name)
        for name in ["config.json", *(p.name for p in directory.iterdir() if export.is_weights(p.name))]:
            (directory / name).rename(base_dir / name)
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
        model = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
        model.save_pretrained(directory)
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}


def export_checkpoint(snapshot_dir: Path, job_id: int, out: Path, *, checkpoint_dir: Path | None = None,
                      dtype: str = "as-trained", prompt_format: PromptFormat | None = None) -> dict:
    """Write the model of job ``job_id``'s last checkpoint (``<snapshot-dir>/job<ID>-checkpoint`` unless
    ``checkpoint_dir``) to ``out``, with the base's config and tokenizer (as :func:`export_version`)."""
    root = job_store(snapshot_dir, job_id)
    store = CheckpointStore(checkpoint_dir or Path(snapshot_dir) / f"job{job_id}-checkpoint")
    checkpoint = store.load()
    if checkpoint is None:
        raise export.ExportError(f"no checkpoint at {store.path}")
    if checkpoint.job.get("job_id") not in (None, job_id):
        raise export.ExportError(f"{store.path} is the checkpoint of job {checkpoint.job['job_id']}, not {job_id}")
    sharded = store.sharded_path(checkpoint)  # an FSDP learner's: the weights are in the ranks' shards
    payload = tensors_bytes(fsdp.whole_model(sharded) if sharded else checkpoint.model)  # tied: saved once
    manifest = build_manifest(payload, job_id=job_id, version=checkpoint.version)
    parts = split(payload, manifest.chunk_bytes)
    base, fetch_base = export.local_version(root, 0)
    fmt = prompt_format or saved_prompt_format(snapshot_dir, job_id, checkpoint_dir)
    members = export.plan(base, fetch_base, manifest, parts.__getitem__, dtype=dtype, prompt_format=fmt)
    return _written(job_id, checkpoint.version, dtype, export.write_directory(members, out), members, fmt)


def _written(job_id: int, version: int, dtype: str, out: Path, members: list[export.Member],
             fmt: PromptFormat) -> dict:
    return {"job": job_id, "version": version, "dtype": dtype, "prompt_format": fmt.model_dump(),
            "out": str(out.resolve()), "files": {m.name: m.size for m in members}}
