"""What scripts/gpu_smoke_torch.py's checks share: the sizes (GPU and the CPU dry run), the check runner and its
PASS/FAIL/SKIP lines, a log tee, device timing helpers, weight digests, and the locally built Qwen2-shaped model."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GiB = 2**30


@dataclass(frozen=True)
class Sizes:
    """What the run builds and generates: the GPU sizes of the smoke run, or toy ones for ``--cpu``."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    prompts: int  # the long generation: prompts x group, new_tokens each
    group: int
    new_tokens: int
    micro_batch: int
    demo_prompts: int = 16  # the demo's job: R = 128 = 16 prompts x 8, 2 new tokens
    demo_group: int = 8
    demo_new_tokens: int = 2


GPU = Sizes(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, prompts=64, group=8,
            new_tokens=512, micro_batch=32)
CPU = Sizes(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=1000, prompts=4, group=4,
            new_tokens=16, micro_batch=4, demo_prompts=4, demo_group=4)


class Checks:
    def __init__(self, deadline_s: float | None = None) -> None:
        self.passed = self.failed = self.skipped = 0
        self.done: set[str] = set()
        self.deadline = time.monotonic() + deadline_s if deadline_s else None

    def run(self, key: str, name: str, test: Callable[[], str | None], *, needs: Iterable[str] = ()) -> bool:
        missing = [k for k in needs if k not in self.done]
        if missing:
            self.skip(name, f"needs {', '.join(missing)}, which did not pass")
            return False
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.skip(name, "out of time (--deadline-s)")
            return False
        started = time.perf_counter()
        try:
            detail = test()
        except Exception as err:  # report and go on: one line per check
            self.failed += 1
            print(f"FAIL {name}: {type(err).__name__}: {err}", flush=True)
            return False
        self.passed += 1
        self.done.add(key)
        took = time.perf_counter() - started
        print(f"PASS {name}" + (f" ({detail})" if detail else "") + f" [{took:.1f}s]", flush=True)
        return True

    def skip(self, name: str, reason: str) -> None:
        self.skipped += 1
        print(f"SKIP {name}: {reason}", flush=True)


class Tee:
    """Write to the terminal and to a log file."""

    def __init__(self, stream, log) -> None:  # noqa: ANN001 - text streams
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.log.write(text)
        self.log.flush()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


# --- helpers ------------------------------------------------------------------------------------------------------


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"peak {torch.cuda.max_memory_allocated() / GiB:.2f} GiB allocated"
    return "peak n/a on CPU"


class WeightsDigest:
    """A sha256 of named tensors as published, whatever order they come in: each tensor's name, dtype, shape and
    bytes (floating ones cast to ``dtype``, the snapshot dtype, on the CPU) hashed alone, then the names in order."""

    def __init__(self, dtype) -> None:  # noqa: ANN001 - a torch dtype
        self.dtype, self.parts = dtype, {}

    def add(self, name: str, tensor) -> None:  # noqa: ANN001
        import torch

        cast = tensor.detach().to("cpu")
        if cast.is_floating_point():
            cast = cast.to(self.dtype)
        cast = cast.contiguous()
        h = hashlib.sha256(f"{cast.dtype}|{tuple(cast.shape)}|".encode())
        h.update(cast.reshape(-1).view(torch.uint8).numpy())
        self.parts[name] = h.hexdigest()

    def hexdigest(self) -> str:
        return hashlib.sha256("".join(f"{k}={v};" for k, v in sorted(self.parts.items())).encode()).hexdigest()


def digesting(pairs: Iterable[tuple[str, Any]], into: WeightsDigest) -> Iterator[tuple[str, Any]]:
    """Pass (name, tensor) pairs through (to the snapshot store), hashing each on the way."""
    for name, tensor in pairs:
        into.add(name, tensor)
        yield name, tensor


def digest(pairs: Iterable[tuple[str, Any]], dtype) -> str:  # noqa: ANN001
    into = WeightsDigest(dtype)
    for name, tensor in pairs:
        into.add(name, tensor)
    return into.hexdigest()


def engine_digest(engine, dtype) -> str:  # noqa: ANN001
    """The engine model's weights hashed as the learner's are (state-dict order, a tied tensor once)."""
    from learner.fsdp import full_tensors

    return digest(full_tensors(engine.model), dtype)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count_tokens(groups) -> int:  # noqa: ANN001
    return sum(len(c.completion_ids) for group in groups for c in group)


def build_qwen2(directory: Path, *, alphabet: str, sizes: Sizes, device: str) -> tuple[Path, int]:
    """A Qwen2-shaped causal LM with random weights and the task's character tokenizer, saved in bf16 (as released
    checkpoints are) in Hugging Face layout; returns (directory, parameter count). The vocabulary is the real
    model's: ids past the tokenizer's decode to nothing (the engine drops them from the text, not the ids)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from learner.tiny import build_tokenizer

    tokenizer = build_tokenizer(alphabet)
    config = Qwen2Config(vocab_size=sizes.vocab, hidden_size=sizes.hidden, intermediate_size=sizes.intermediate,
                         num_hidden_layers=sizes.layers, num_attention_heads=sizes.heads,
                         num_key_value_heads=sizes.kv_heads, max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model = model.to(torch.bfloat16)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    count = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    del model
    return directory, count
