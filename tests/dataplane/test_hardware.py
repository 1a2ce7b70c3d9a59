"""The hardware an agent reports (dataplane/hardware.py): bounded, checked, sent in the hello; and the memory a job
needs when its owner gives none (dataplane/requirements.py)."""

from __future__ import annotations

import json

import pytest

from dataplane import messages as m
from dataplane.hardware import Hardware, parse_hardware
from dataplane.requirements import GB, Requirements, estimate_memory, memory_needed
from worker_agent.hardware import probe

H100 = {"gpus": [{"name": "NVIDIA H100", "memory_gb": 80.0, "capability": "9.0"}] * 2, "cuda": "12.4",
        "driver": "550.54", "engines": ["hf", "vllm"], "cpu_count": 32, "ram_gb": 256.0, "disk_free_gb": 900.0}


def test_a_hello_carries_the_hardware_and_its_summary():
    hello = m.parse_agent_message({"type": "hello", "agent_version": "1", "hardware": H100})
    assert hello.hardware.gpu_count == 2 and hello.hardware.gpu_memory_gb == 80.0
    assert hello.hardware.summary() == "2 x NVIDIA H100 (80 GB, sm 9.0), 32 CPUs, 256 GB RAM, 900 GB free, hf+vllm"
    assert m.parse_agent_message({"type": "hello", "agent_version": "1"}).hardware is None


@pytest.mark.parametrize(("change", "field"), [
    ({"gpus": [{"name": "x", "memory_gb": 1e9}]}, "gpus.0.memory_gb"),
    ({"gpus": [{"name": "x\x00", "memory_gb": 8}]}, "gpus.0.name"),
    ({"gpus": [{"name": "x", "memory_gb": 8, "capability": "sm_90"}]}, "gpus.0.capability"),
    ({"engines": ["tensorrt"]}, "engines.0"),
    ({"ram_gb": float("nan")}, "ram_gb"),
    ({"cpu_count": 0}, "cpu_count"),
    ({"driver": "9" * 100}, "driver"),
    ({"gpus": [{"name": "x", "memory_gb": 8}] * 65}, "gpus"),
    ({"extra": 1}, "extra"),
])
def test_bad_hardware_is_refused_naming_the_field(change, field):
    with pytest.raises(ValueError, match=f"hardware.{field}"):
        parse_hardware({**H100, **change})
    with pytest.raises(m.MessageError):
        m.parse_agent_message({"type": "hello", "agent_version": "1", "hardware": {**H100, **change}})


def test_the_probe_on_this_cpu_machine_reports_no_gpu_and_the_hf_engine(tmp_path):
    facts = probe(tmp_path)
    assert facts.gpus == [] and facts.gpu_memory_gb == 0.0 and "vllm" not in facts.engines and "hf" in facts.engines
    assert facts.cpu_count >= 1 and facts.ram_gb > 0 and facts.disk_free_gb > 0
    assert facts.model_memory_gb == facts.ram_gb  # a CPU-only worker serves from its RAM
    assert Hardware.model_validate(facts.model_dump()) == facts


def _checkpoint(tmp_path, *, weights_bytes: int, **config):
    shape = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 32768, "torch_dtype": "bfloat16", "vocab_size": 128256} | config
    (tmp_path / "config.json").write_text(json.dumps(shape))
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.truncate(weights_bytes)
    return str(tmp_path)


def test_the_memory_estimate_is_the_documented_sum(tmp_path):
    model = _checkpoint(tmp_path, weights_bytes=16 * 10**9)  # 8B parameters in bf16
    hf = estimate_memory(model, engine="hf", snapshot_dtype="bf16", max_new_tokens=512, group_size=8)
    # KV: 2 (K, V) x 32 layers x 8 heads x 128 head dim x 2 bytes x 1024 tokens x 16 sequences
    kv = 2 * 32 * 8 * 128 * 2 * 1024 * 16
    assert hf.gb == pytest.approx(((16e9 + kv) * 1.2 + 0.5 * GB) / GB, abs=1e-3)
    vllm = estimate_memory(model, engine="vllm", snapshot_dtype="bf16", max_new_tokens=512, group_size=8)
    assert vllm.gb == pytest.approx(((16e9 + kv) / 0.9 + 1.0 * GB) / GB, abs=1e-3)
    fp32 = estimate_memory(model, engine="hf", snapshot_dtype="fp32", max_new_tokens=512, group_size=8)
    assert fp32.gb > hf.gb * 1.9  # fp32 snapshots: twice the bytes per weight
    assert "8B parameters" in hf.note


def test_the_owners_figure_wins_and_an_unreadable_model_matches_on_nothing(tmp_path):
    model = _checkpoint(tmp_path, weights_bytes=10**6)
    estimate = estimate_memory(model, engine="hf", snapshot_dtype="bf16", max_new_tokens=8, group_size=4)
    assert memory_needed(Requirements(min_gpu_memory_gb=40), estimate) == (40, "given")
    assert memory_needed(Requirements(), estimate)[0] == estimate.gb
    (tmp_path / "config.json").write_text("")
    assert estimate_memory(model, engine="hf", snapshot_dtype="bf16", max_new_tokens=8, group_size=4) is None
    assert memory_needed(Requirements(), None)[0] is None


def test_the_estimate_reads_no_fifo_and_no_oversized_config(tmp_path):
    """The site estimates from the path a job names: a FIFO named config.json must not hang it, a huge file must not
    fill its memory; each is no estimate (matching on the other requirements)."""
    import os

    model = _checkpoint(tmp_path, weights_bytes=10**6)
    config = tmp_path / "config.json"
    config.unlink()
    os.mkfifo(config)  # no writer: a blocking open would hang
    assert estimate_memory(model, engine="hf", snapshot_dtype="bf16", max_new_tokens=8, group_size=4) is None
    config.unlink()
    config.write_bytes(b" " * (2 << 20))
    assert estimate_memory(model, engine="hf", snapshot_dtype="bf16", max_new_tokens=8, group_size=4) is None
