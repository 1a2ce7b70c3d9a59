"""Build a tiny causal LM and a character tokenizer for a task, saved in Hugging Face layout.

Tests and the demo cannot download checkpoints, so they make one here and then load it through the
same ``from_pretrained`` path a real checkpoint directory takes.
"""

from __future__ import annotations

from pathlib import Path

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


def build_tokenizer(alphabet: str):
    """A character-level fast tokenizer: one token per character of ``alphabet`` plus pad/bos/eos; its
    post-processor puts the BOS in front of every text encoded with special tokens (the default)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(alphabet))
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, *chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    # One token per character; in Oniguruma's syntax (?m) lets "." match newlines as well.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    # The tokenizer adds its BOS itself, as Llama's does: tokenizer(prompt) is the stream the model is trained on
    # (dataplane/chat.py), with no BOS put in front by hand.
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                        special_tokens=[(BOS, vocab[BOS])])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   unk_token=PAD, padding_side="left")


def build_tiny_model(directory: str | Path, *, alphabet: str, hidden: int = 64, layers: int = 2, heads: int = 4,
                     seed: int = 0) -> Path:
    """Write a randomly initialised Llama-architecture model and its tokenizer to ``directory``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(alphabet)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
