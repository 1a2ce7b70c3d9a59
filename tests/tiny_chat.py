"""A tiny random Llama with a character tokenizer and ChatML's tokens and template: a stand-in, in tests, for an
instruct model's chat template (the engines and the learner render the same conversation through it)."""

from __future__ import annotations

from pathlib import Path

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def tiny_chatml_model(directory: Path, alphabet: str):
    """Write the model and its tokenizer to ``directory`` (seed 0); return the tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from learner.tiny import build_tokenizer

    tokenizer = build_tokenizer(alphabet)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=4, pad_token_id=tokenizer.pad_token_id,
                                 bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                 )).save_pretrained(directory)
    return tokenizer
