"""The HF engine's contract on whatever torch and transformers this interpreter has; one PASS/FAIL line per check.

Run by ``scripts/hf-engine-compat.sh`` inside a venv holding another transformers (the oldest the pins allow),
where the test suite's dependencies (Django, Redis) are not installed: ``python scripts/hf_engine_check.py``.
Exit status 0 when every check passed.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable

PROMPTS = ["3+4=", "12+5=", "9+9="]


def main() -> int:
    import torch
    import transformers

    from dataplane.tasks import build_task
    from learner.tiny import build_tiny_model
    from worker_agent.engines.base import SamplingParams
    from worker_agent.engines.hf import HFEngine

    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    torch.set_num_threads(1)
    model_dir = build_tiny_model(tempfile.mkdtemp(prefix="echo2-hf-check-") + "/tiny",
                                 alphabet=build_task({"name": "arithmetic"}).alphabet, hidden=32, layers=1)
    engine = HFEngine(str(model_dir), device="cpu", seed=0)
    results: list[bool] = []

    def check(name: str, test: Callable[[], None]) -> None:
        try:
            test()
        except Exception as err:  # one line per failed check, then go on
            print(f"FAIL {name}: {type(err).__name__}: {err}")
            results.append(False)
        else:
            print(f"PASS {name}")
            results.append(True)

    def sampling() -> None:
        groups = engine.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9))
        assert [len(g) for g in groups] == [4, 4, 4], [len(g) for g in groups]
        for prompt, group in zip(PROMPTS, groups, strict=True):
            for c in group:
                assert c.prompt_ids == engine.encode_prompt(prompt)
                assert 1 <= len(c.completion_ids) == len(c.logprobs) <= 6

    def raw_logprobs() -> None:  # the log-probs of the sampled tokens under one full forward pass
        for group in engine.generate(PROMPTS, n=2, params=SamplingParams(max_new_tokens=6, temperature=0.7)):
            for c in group:
                ids = torch.tensor([c.prompt_ids + c.completion_ids])
                with torch.no_grad():
                    logits = engine.model(input_ids=ids).logits[0, len(c.prompt_ids) - 1:-1].float()
                expected = torch.log_softmax(logits, -1).gather(1, ids[0, len(c.prompt_ids):, None]).squeeze(1)
                worst = max(abs(a - b) for a, b in zip(c.logprobs, expected.tolist(), strict=True))
                assert worst < 1e-4, f"log-probs off by {worst}"

    def greedy() -> None:
        params = SamplingParams(max_new_tokens=6, temperature=0.0)
        first, second = engine.generate(PROMPTS, n=3, params=params), engine.generate(PROMPTS, n=3, params=params)
        assert first == second
        assert all(g[0] == g[1] == g[2] for g in first)
        assert engine.generate(PROMPTS, n=1, params=SamplingParams(max_new_tokens=6, temperature=0.005)) == [
            g[:1] for g in first], "a temperature below 0.01 is greedy"

    def stop_string() -> None:
        groups = engine.generate_ids([engine.encode_prompt(p) for p in PROMPTS], n=8,
                                     params=SamplingParams(max_new_tokens=8), stop=["1"])
        for c in (c for g in groups for c in g):
            assert "1" not in c.text[:-1], c.text  # stops at the first "1", which stays in the text

    def install() -> None:
        greedy_params = SamplingParams(max_new_tokens=4, temperature=0.0)
        original = {k: v.clone() for k, v in engine.model.state_dict().items()}
        before = engine.generate(PROMPTS, n=1, params=greedy_params)
        generator = torch.Generator().manual_seed(0)
        engine.load_weights({k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in original.items()})
        assert engine.generate(PROMPTS, n=1, params=greedy_params) != before
        engine.load_weights(original)
        assert engine.generate(PROMPTS, n=1, params=greedy_params) == before

    for name, test in [("sampling n=4", sampling), ("raw log-probs", raw_logprobs), ("greedy n=3", greedy),
                       ("stop string", stop_string), ("weight install", install)]:
        check(name, test)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
