"""The vLLM engine: its pure helpers (any machine), then against the HF engine on a tiny model (GPU with vLLM only),
and the engine factory. ``scripts/gpu-smoke.sh`` runs the same checks, and more, as one command on a GPU machine."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from dataplane.records import TrajectoryGroup
from dataplane.tasks import build_task
from worker_agent.engines import make_engine
from worker_agent.engines.base import SamplingParams
from worker_agent.engines.vllm_support import (
    TIED_HEAD,
    check_snapshot_keys,
    checkpoint_keys,
    reset_prefix_cache,
    sampling_kwargs,
    version_status,
)
from worker_agent.rollout import GroupLease, rollout_groups

PROMPTS = ["3+4=", "12+5=", "9+9="]
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def needs_vllm_gpu(test):
    """Mark ``test`` gpu and skip it (never fake it) without vLLM or a CUDA GPU."""
    test = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")(test)
    test = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'echo2[vllm]')")(test)
    return pytest.mark.gpu(test)


# -- pure helpers: no vLLM, no GPU ---------------------------------------------------------------------------------


def test_sampling_asks_for_n_seeded_samples_with_raw_settings() -> None:
    kwargs = sampling_kwargs(SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9), n=3, stop=["</a>"],
                             seed=1234)

    assert kwargs == {"n": 3, "temperature": 0.7, "top_p": 0.9, "seed": 1234, "max_tokens": 6, "logprobs": 0,
                      "stop": ["</a>"], "include_stop_str_in_output": True}


@pytest.mark.parametrize("temperature", [0.0, 0.005, 0.0099])
def test_greedy_asks_for_one_unseeded_sample(temperature: float) -> None:
    """vLLM refuses greedy with n > 1 and raises temperatures in (0, 0.01) to 0.01: below 0.01 is greedy, one
    sample, which the engine returns n times."""
    kwargs = sampling_kwargs(SamplingParams(temperature=temperature, top_p=0.5), n=4, stop=[], seed=99)

    assert (kwargs["n"], kwargs["temperature"], kwargs["top_p"], kwargs["seed"]) == (1, 0.0, 1.0, None)


def test_temperature_at_the_threshold_samples() -> None:
    assert sampling_kwargs(SamplingParams(temperature=0.01), n=2, stop=[], seed=5)["temperature"] == 0.01


def test_checkpoint_keys_read_the_headers(tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    keys, tied = checkpoint_keys(tiny_model_dir)
    state = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict()

    assert tied is True
    assert keys == set(state) - {TIED_HEAD}  # save_pretrained leaves the tied head out


def test_checkpoint_without_safetensors_is_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")

    with pytest.raises(ValueError, match="no safetensors checkpoint"):
        checkpoint_keys(tmp_path)


def test_snapshot_keys_must_be_the_checkpoints() -> None:
    expected = frozenset({"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.mlp.up_proj.weight"})

    check_snapshot_keys(expected, expected=expected, tied_head=True)
    check_snapshot_keys(expected | {TIED_HEAD}, expected=expected, tied_head=True)  # a tied head may come along
    with pytest.raises(ValueError, match=r"missing=\['model.norm.weight'\] unexpected=\[\]"):
        check_snapshot_keys(expected - {"model.norm.weight"}, expected=expected, tied_head=True)
    with pytest.raises(ValueError, match=r"unexpected=\['lm_head.weight'\]"):
        check_snapshot_keys(expected | {TIED_HEAD}, expected=expected, tied_head=False)
    with pytest.raises(ValueError, match=r"missing=\['lm_head.weight'\]"):
        check_snapshot_keys(expected, expected=expected | {TIED_HEAD}, tied_head=False)


def test_prefix_cache_reset_is_retried_then_forced() -> None:
    answers, calls, waits = [False, False, True], [], []

    def reset(**kwargs) -> bool:
        calls.append(kwargs)
        return answers.pop(0)

    assert reset_prefix_cache(reset, attempts=5, wait_s=0.1, sleep=waits.append) == 3
    assert calls == [{}, {}, {}] and waits == [0.1, 0.2]

    calls.clear()
    forced = iter([False, False, True])
    assert reset_prefix_cache(lambda **kw: calls.append(kw) or next(forced), attempts=2, sleep=lambda _: None) == 3
    assert calls[-1] == {"reset_running_requests": True}


def test_prefix_cache_that_never_resets_fails_the_install() -> None:
    with pytest.raises(RuntimeError, match="did not reset its prefix cache after 3 tries"):
        reset_prefix_cache(lambda **kw: False, attempts=2, sleep=lambda _: None)


@pytest.mark.parametrize(("version", "status"), [("0.34.0", "tested"), ("0.34.2", "tested"), ("0.33.0", "tested"),
                                                 ("0.32.1", "older"),
                                                 ("0.35.0", "newer"), ("0.8.3", "older"), ("banana", "unknown")])
def test_version_status(version: str, status: str) -> None:
    assert version_status(version) == status


class _StubWorker:
    """Stands in for a vLLM worker under :class:`WeightLoader`: its ``reload_weights`` consumes the iterator into a
    transformers model, as vLLM's loads a checkpoint-format stream into its own."""

    def __init__(self, model) -> None:
        self.model_runner = type("Runner", (), {"model": model})()

    def reload_weights(self, weights_iterator) -> None:
        state = dict(weights_iterator)
        self.model_runner.model.load_state_dict(state, strict=False)


class _StubLLM:
    def __init__(self, worker, resets: list[bool]) -> None:
        self.worker, self.resets, self.rpcs = worker, resets, []

    def collective_rpc(self, method: str, args: tuple = ()):
        from worker_agent.engines.vllm import WeightLoader

        self.rpcs.append((method, args))
        return [getattr(WeightLoader, method)(self.worker, *args)]

    def reset_prefix_cache(self, **kwargs) -> bool:
        return self.resets.pop(0)


def _engine_with_stub_llm(model_dir, resets: list[bool]):
    """The engine's install path against stand-ins for vLLM's LLM and worker (vLLM itself runs in the GPU tests)."""
    from transformers import AutoModelForCausalLM

    from worker_agent.engines.vllm import VLLMEngine

    engine = object.__new__(VLLMEngine)
    engine.expected_keys, engine.tied_head = checkpoint_keys(model_dir)
    engine.install_dir, engine.last_install, engine._partial = None, {}, None
    engine.llm = _StubLLM(_StubWorker(AutoModelForCausalLM.from_pretrained(str(model_dir))), resets)
    return engine


def test_install_sends_a_file_path_and_the_workers_load_every_tensor(tiny_model_dir, tmp_path) -> None:
    engine = _engine_with_stub_llm(tiny_model_dir, resets=[False, True])
    engine.install_dir = str(tmp_path)
    model = engine.llm.worker.model_runner.model
    snapshot = {k: v + 1.0 for k, v in model.state_dict().items()}  # tied head included, sharing storage

    engine.load_weights(snapshot)

    [(method, (path,))] = engine.llm.rpcs
    assert method == "echo2_install" and path.startswith(str(tmp_path)) and path.endswith(".safetensors")
    assert list(tmp_path.iterdir()) == []  # the file is gone once installed
    assert engine.last_install["loaded"] == len(snapshot) and engine.last_install["prefix_cache_resets"] == 2
    assert all(torch.equal(model.state_dict()[k], v) for k, v in snapshot.items())


def test_install_that_fails_in_the_workers_blocks_generation(tiny_model_dir) -> None:
    engine = _engine_with_stub_llm(tiny_model_dir, resets=[False] * 10)
    state = engine.llm.worker.model_runner.model.state_dict()

    with pytest.raises(RuntimeError, match="did not reset its prefix cache"):
        engine.load_weights(state)
    with pytest.raises(RuntimeError, match="partly installed"):
        engine.generate_ids([[1, 2]], n=1, params=SamplingParams())


def test_install_with_missing_weights_sends_nothing(tiny_model_dir) -> None:
    engine = _engine_with_stub_llm(tiny_model_dir, resets=[True])
    state = engine.llm.worker.model_runner.model.state_dict()

    with pytest.raises(ValueError, match="missing"):
        engine.load_weights({k: v for k, v in state.items() if "layers.0.mlp" not in k})
    assert engine.llm.rpcs == []


# -- on a GPU with vLLM -----------------------------------------------------------------------------------------------


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
def test_vllm_greedy_returns_n_copies_like_hf(vllm_engine, vllm_model_dir) -> None:
    hf = make_engine("hf", str(vllm_model_dir), device="cuda", seed=0)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)

    groups = vllm_engine.generate(PROMPTS, n=3, params=greedy)

    assert all(len(g) == 3 and g[0] == g[1] == g[2] for g in groups)
    assert [g[0].completion_ids for g in groups] == [g[0].completion_ids for g in hf.generate(PROMPTS, n=3,
                                                                                               params=greedy)]


@needs_vllm_gpu
def test_vllm_installs_weights_in_place(vllm_engine, vllm_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    original = AutoModelForCausalLM.from_pretrained(str(vllm_model_dir)).state_dict()
    before = vllm_engine.generate(PROMPTS, n=1, params=greedy)

    generator = torch.Generator().manual_seed(0)
    vllm_engine.load_weights({k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in original.items()})
    assert vllm_engine.last_install["loaded"] == len(original)
    assert vllm_engine.last_install["prefix_cache_resets"] >= 1
    after = vllm_engine.generate(PROMPTS, n=1, params=greedy)
    assert [g[0].logprobs for g in after] != [g[0].logprobs for g in before]

    vllm_engine.load_weights(original)
    restored = vllm_engine.generate(PROMPTS, n=1, params=greedy)
    assert [g[0].completion_ids for g in restored] == [g[0].completion_ids for g in before]


@needs_vllm_gpu
def test_vllm_refuses_a_snapshot_with_missing_weights(vllm_engine, vllm_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(str(vllm_model_dir)).state_dict()
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    before = vllm_engine.generate(PROMPTS, n=1, params=greedy)

    with pytest.raises(ValueError, match="missing"):
        vllm_engine.load_weights({k: v for k, v in state.items() if "layers.0.mlp" not in k})
    assert vllm_engine.generate(PROMPTS, n=1, params=greedy) == before  # nothing was installed


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
