"""The learner trains fp32 master weights whatever dtype the base checkpoint was saved in (issue 33's first GPU run:
a bf16 checkpoint, as released models are, became bf16 parameters and bf16 AdamW updates)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dataplane.jobs import JobSpec
from learner.policy import build_policy, load_model


def test_a_bf16_checkpoint_is_trained_in_fp32(tmp_path, tiny_model_dir) -> None:
    bf16_dir = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).to(torch.bfloat16).save_pretrained(bf16_dir)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(bf16_dir)
    saved = AutoModelForCausalLM.from_pretrained(bf16_dir)
    assert next(saved.parameters()).dtype == torch.bfloat16  # what transformers gives by itself

    spec = JobSpec(name="bf16", model_dir=str(bf16_dir), task={"name": "arithmetic"}, loss={"kl_beta": 0.1})
    trainer, _ = build_policy(spec, device="cpu")
    for model in (trainer.module, trainer.reference):
        assert {p.dtype for p in model.parameters()} == {torch.float32}
    for name, tensor in saved.state_dict().items():  # the same values, widened exactly
        assert torch.equal(trainer.module.state_dict()[name], tensor.float()), name
    assert trainer.module.lm_head.weight is trainer.module.model.embed_tokens.weight  # still tied
    assert {p.dtype for p in load_model(str(tiny_model_dir)).parameters()} == {torch.float32}
