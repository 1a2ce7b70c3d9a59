"""The vLLM engine against the HF engine on a tiny model (GPU with vLLM only), and the engine factory."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from dataplane.records import TrajectoryGroup
from dataplane.tasks import build_task
from worker_agent.engines import make_engine
from worker_agent.engines.base import SamplingParams
from worker_agent.rollout import GroupLease, rollout_groups

PROMPTS = ["3+4=", "12+5=", "9+9="]
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def needs_vllm_gpu(test):
    """Mark ``test`` gpu and skip it (never fake it) without vLLM or a CUDA GPU."""
    test = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")(test)
    test = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'echo2[vllm]')")(test)
    return pytest.mark.gpu(test)


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    """A tiny model with a head size vLLM's attention kernels support (64)."""
    from learner.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("models") / "tiny-vllm"
    return build_tiny_model(path, alphabet=build_task({"name": "arithmetic"}).alphabet, hidden=256, layers=2, heads=4)


@pytest.fixture(scope="module")
def vllm_engine(vllm_model_dir):
    from worker_agent.engines.vllm import VLLMEngine

    engine = VLLMEngine(str(vllm_model_dir), seed=0, dtype="float32", gpu_memory_utilization=0.3, max_model_len=128,
                        enforce_eager=True)
    yield engine
    del engine


@needs_vllm_gpu
@pytest.mark.parametrize("engine_name", ["hf", "vllm"])
def test_records_from_both_engines_validate(engine_name: str, vllm_model_dir, request) -> None:
    if engine_name == "vllm":
        engine = request.getfixturevalue("vllm_engine")
    else:
        engine = make_engine("hf", str(vllm_model_dir), device="cuda", seed=0)
    task = build_task({"name": "arithmetic"})
    leases = [GroupLease(lease_id=f"1-{i}", group_id=f"g{i}", prompt=p) for i, p in enumerate(PROMPTS)]

    groups = rollout_groups(engine, task, leases, job_id=1, n=4, params=SamplingParams(max_new_tokens=6), version=0)

    assert [len(g.records) for g in groups] == [4, 4, 4]
    for lease, group in zip(leases, groups, strict=True):
        group = TrajectoryGroup.model_validate_json(group.model_dump_json())  # as the site parses it
        group.check_for_job(job_id=1, group_size=4, max_version=0)
        for record in group.records:
            assert record.prompt_ids == engine.encode_prompt(lease.prompt)
            assert 1 <= len(record.completion_ids) <= 6


@needs_vllm_gpu
def test_vllm_logprobs_are_the_raw_policy_of_the_hf_model(vllm_engine, vllm_model_dir) -> None:
    hf = make_engine("hf", str(vllm_model_dir), device="cuda", seed=0)
    params = SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9)  # raw log-probs ignore both

    for group in vllm_engine.generate(PROMPTS, n=3, params=params):
        for c in group:
            ids = torch.tensor([c.prompt_ids + c.completion_ids], device=hf.device)
            with torch.no_grad():
                logits = hf.model(input_ids=ids).logits[0, len(c.prompt_ids) - 1:-1].float()
            expected = torch.log_softmax(logits, -1).gather(1, ids[0, len(c.prompt_ids):, None]).squeeze(1)
            assert c.logprobs == pytest.approx(expected.tolist(), abs=2e-3)


@needs_vllm_gpu
def test_vllm_installs_weights_in_place(vllm_engine, vllm_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    original = AutoModelForCausalLM.from_pretrained(str(vllm_model_dir)).state_dict()
    before = vllm_engine.generate(PROMPTS, n=1, params=greedy)

    generator = torch.Generator().manual_seed(0)
    vllm_engine.load_weights({k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in original.items()})
    after = vllm_engine.generate(PROMPTS, n=1, params=greedy)
    assert [g[0].logprobs for g in after] != [g[0].logprobs for g in before]

    vllm_engine.load_weights(original)
    restored = vllm_engine.generate(PROMPTS, n=1, params=greedy)
    assert [g[0].completion_ids for g in restored] == [g[0].completion_ids for g in before]


@pytest.mark.skipif(HAS_VLLM, reason="checks the message shown where vLLM is missing")
def test_vllm_engine_without_vllm_says_how_to_install_it(tmp_path) -> None:
    from worker_agent.engines.vllm import VLLMEngine, VLLMUnavailable

    with pytest.raises(VLLMUnavailable, match=r"pip install 'echo2\[vllm\]'"):
        VLLMEngine(str(tmp_path))


@pytest.mark.skipif(HAS_VLLM and torch.cuda.is_available(), reason="auto picks vllm here")
def test_auto_engine_falls_back_to_hf(tiny_model_dir) -> None:
    from worker_agent.engines.hf import HFEngine

    assert isinstance(make_engine("auto", str(tiny_model_dir), device="cpu", seed=0), HFEngine)
    assert isinstance(make_engine(None, str(tiny_model_dir), device="cpu"), HFEngine)


def test_unknown_engine_is_refused(tiny_model_dir) -> None:
    with pytest.raises(ValueError, match=r"^engine: unknown engine 'tgi'; use one of hf, vllm"):
        make_engine("tgi", str(tiny_model_dir))
