"""The learner's snapshots (learner/snapshots.py): bf16 by default (fp32 on request), streamed into chunks; the
first version full and the others lossless deltas against the version before (every K-th full on request), each
rebuilding the learner's cast bit for bit; a delta that does not pay, or a model whose layout changed, is published
full."""

from __future__ import annotations

import torch
from safetensors.torch import load
from transformers import AutoModelForCausalLM

from dataplane.broadcast.store import full_payload, iter_chunks, list_versions, read_version, version_dir
from dataplane.delta import apply_delta
from dataplane.snapshot import ordered_chunks
from learner.snapshots import SnapshotStore, publishable_state


def train(model: torch.nn.Module, *, lr: float, steps: int = 1) -> None:
    """Real AdamW steps on a real loss: what moves the weights between two publications."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    ids = torch.randint(3, model.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(steps))
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def cast(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) for k, v in publishable_state(model).items()}


def bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Equal bit patterns, tensor by tensor (NaN == NaN, -0.0 != 0.0): what bit-identical means."""
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(
        a[k].contiguous().view(torch.uint8), b[k].contiguous().view(torch.uint8)) for k in a)


def full_chunks(store: SnapshotStore, version: int):
    manifest, directory = full_payload(store.root, version)
    return manifest, list(iter_chunks(directory, manifest))


def test_bf16_by_default_every_kth_version_full_and_each_delta_rebuilds_the_cast_bit_for_bit(tmp_path,
                                                                                            tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    store = SnapshotStore(tmp_path, job_id=3, chunk_bytes=2048, keep=10, full_every=3)
    kinds, expected = [], {}
    for version in range(1, 8):
        train(model, lr=1e-5)
        manifest = store.write(model, version)
        kinds.append(manifest.kind)
        expected[version] = cast(model, torch.bfloat16)
        if manifest.kind == "delta":
            assert manifest.base_version == version - 1 and manifest.dtype == "bf16"
            assert manifest.total_bytes < 0.5 * manifest.full.total_bytes
    assert kinds == ["full", "delta", "delta", "full", "delta", "delta", "full"]

    held_manifest, held = full_chunks(store, 1)
    assert bits_equal(load(b"".join(held)), expected[1])  # the full payload is a plain safetensors file
    for version in range(2, 8):  # what an agent does: apply each delta to the weights it holds
        published, chunks = read_version(version_dir(store.root, version))
        if published.kind == "delta":
            held = apply_delta(published, ordered_chunks(published, chunks), held_manifest, held)
            held_manifest = published.full
        else:
            held_manifest, held = published, ordered_chunks(published, chunks)
        assert bits_equal(load(b"".join(held)), expected[version]), version
        assert held == full_chunks(store, version)[1]


def test_fp32_on_request_and_a_delta_that_does_not_pay_is_published_full(tmp_path, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    store = SnapshotStore(tmp_path, job_id=3, chunk_bytes=2048, dtype="fp32")
    first = store.write(model, 1)
    assert first.kind == "full" and first.dtype == "fp32"
    assert bits_equal(load(b"".join(full_chunks(store, 1)[1])), cast(model, torch.float32))
    train(model, lr=1e-2)  # every fp32 weight changes in most of its bits
    second = store.write(model, 2)
    assert second.kind == "full" and not (version_dir(tmp_path, 2) / "full").exists()
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)  # one small tensor moves
    third = store.write(model, 3)
    assert third.kind == "delta" and third.total_bytes < 0.05 * third.full.total_bytes


def test_a_restarted_store_goes_on_counting_and_a_model_of_another_layout_is_published_full(tmp_path,
                                                                                           tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    store = SnapshotStore(tmp_path, job_id=3, chunk_bytes=2048, full_every=3)
    assert [store.write(model, v).kind for v in (1, 2)] == ["full", "delta"]
    again = SnapshotStore(tmp_path, job_id=3, chunk_bytes=2048, full_every=3)  # the learner restarted
    assert [again.write(model, v).kind for v in (3, 4, 5)] == ["delta", "full", "delta"]
    assert again.write(torch.nn.Linear(4, 2), 6).kind == "full"  # nothing to XOR it with
    assert SnapshotStore(tmp_path, job_id=3, chunk_bytes=2048, full_every=1).write(model, 7).kind == "full"


def test_echo2_learner_export_of_a_delta_version_writes_its_full_payload(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    from learner.export import export_version

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    store = SnapshotStore(tmp_path / "job3", job_id=3, chunk_bytes=2048)
    store.write_base(tiny_model_dir)
    store.write(model, 1)
    train(model, lr=1e-5)
    assert store.write(model, 2).kind == "delta"
    export_version(tmp_path, 3, tmp_path / "out", version=2)
    assert bits_equal(load_file(tmp_path / "out" / "model.safetensors"), cast(model, torch.bfloat16))


def test_tensors_gathered_one_at_a_time_publish_the_same_bytes_as_the_module(tmp_path, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    gathered = SnapshotStore(tmp_path / "gathered", job_id=3, chunk_bytes=2048)
    whole = SnapshotStore(tmp_path / "whole", job_id=3, chunk_bytes=2048)
    for version in (1, 2):  # a full version, then a delta
        pairs = ((name, tensor.clone()) for name, tensor in publishable_state(model).items())  # as fsdp gives them
        assert gathered.write(pairs, version) == whole.write(model, version)
        assert not (version_dir(tmp_path / "gathered", version) / ".tensors").exists()
        train(model, lr=1e-5)


def test_versions_not_announced_yet_are_not_pruned(tmp_path):
    store = SnapshotStore(tmp_path, job_id=3, chunk_bytes=2048, keep=1)
    model = torch.nn.Linear(8, 4)
    pending = {1, 2}  # the outbox still holds them (the site is down)
    store.pinned = lambda: pending
    for version in (1, 2, 3):
        store.write(model, version)
    assert list_versions(tmp_path) == [1, 2, 3]
    pending.clear()  # announced
    store.write(model, 4)
    assert list_versions(tmp_path) == [4]


def test_a_snapshot_written_from_the_checkpoints_copy_is_the_one_written_from_the_policy(tiny_model_dir,
                                                                                        tmp_path) -> None:
    """The learner process writes a publication step's snapshot on its committer's thread, from the copy of the
    weights its checkpoint took (tied tensors kept shared, then given once): the same bytes, full and delta, as a
    snapshot written from the policy itself."""
    from learner.checkpoint import copied
    from learner.publication import _each_tensor_once

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight  # tied: the case that matters
    stores = {how: SnapshotStore(tmp_path / how, job_id=1, full_every=2) for how in ("policy", "copy")}
    for version in (1, 2):
        train(model, lr=1e-3, steps=version)
        from_copy = stores["copy"].write(_each_tensor_once(copied(model.state_dict())), version)
        from_policy = stores["policy"].write(model, version)
        assert from_copy.kind == from_policy.kind and from_copy.sha256 == from_policy.sha256, version


def test_by_default_only_the_first_version_is_full_and_the_store_keeps_each_versions_full_payload(tmp_path,
                                                                                                tiny_model_dir):
    """Deltas on the wire, fulls from the cache (docs/broadcast.md): after the first version every one is a delta,
    with no full one on a schedule, across a restart; the store keeps the full payload of every version it keeps
    (the newest above all: what a worker that joins or falls behind fetches); and the learner's outbox never
    holds more than MAX_UNANNOUNCED versions for a site that is down: the next one is full and replaces them."""
    from learner.snapshots import MAX_UNANNOUNCED

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    store = SnapshotStore(tmp_path, job_id=3, chunk_bytes=2048, keep=3)
    kinds = []
    for version in range(1, 15):
        train(model, lr=1e-5, steps=version)
        if version == 8:
            store = SnapshotStore(tmp_path, job_id=3, chunk_bytes=2048, keep=3)  # the learner restarted
        kinds.append(store.write(model, version).kind)
        assert full_payload(store.root, version) is not None  # the newest's full, for a late worker
    assert kinds == ["full"] + ["delta"] * 13
    assert list_versions(tmp_path) == [12, 13, 14]
    assert all(full_payload(store.root, v) is not None for v in (12, 13, 14))
    assert bits_equal(load(b"".join(full_chunks(store, 14)[1])), cast(model, torch.bfloat16))

    waiting: set[int] = set()  # the site is down: each version written queues in the outbox
    store.pinned = lambda: waiting
    for version in range(15, 15 + MAX_UNANNOUNCED):
        train(model, lr=1e-5, steps=version)
        assert store.write(model, version).kind == "delta"
        waiting.add(version)
    assert store.write(model, 15 + MAX_UNANNOUNCED).kind == "full"
