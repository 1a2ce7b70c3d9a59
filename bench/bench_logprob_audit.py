"""The log-prob audit under real engine numerics: honest workers' false failures and forgers' detection, per token.

Run: ``.venv/bin/python bench/bench_logprob_audit.py [--model-dir var/models/smollm2-135m-instruct] [--groups 24]
[--n 4] [--max-new-tokens 32] [--sharpen 1 3 6] [--seed 0]``

What runs: the agent's HF engine (``worker_agent.engines.hf``, the model loaded as agents load it: bf16 for
SmolLM2, whose config says so; and the same engine cast to fp32) samples groups at temperature 1, and the
learner's scoring path (``learner.policy`` loads fp32, ``learner.batch.token_logprobs``) recomputes every claimed
log-prob, as an audit does. A *confident policy* is made by sharpening the snapshot: its final norm's weight times
``k`` (every logit times ``k``), published in bf16 as snapshots are, so engine and learner hold the same weights and
most sampled tokens have log-probs near 0 (``--sharpen``: 1 is the base).

Forgeries of the claimed log-probs, each of the same honest samples: ``constant`` (-0.01 for every token, no
policy run), ``rounded`` (the honest bf16 claims rounded to 0.1 nat), ``rounded-0.01`` (to 0.01), ``zero`` (0:
"certain" for every token), ``stale`` (the log-probs of the base policy, not of the sharpened one: a worker that
never installs the snapshot).

The table gives, per policy and claim, the mean log-prob per token, the old rule's mean |claimed - recomputed| gap
against its 0.05 tolerance, and the rule ``learner.audit.logprob_problem`` applies today (per token: at most
``floor + (1 - p) (nats + tail_nats (1 - p))``, p the recomputed probability; a group fails past a share of its
learning tokens): the groups that fail, and how much of its allowance a group's 90th-percentile token uses at most.
Honest rows are the false-positive rate; forged rows the detection rate. ``--save`` keeps the sampled tokens and
``--load`` evaluates them again (under other settings too) without sampling.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.records import Trajectory  # noqa: E402
from learner.audit import AuditSettings, logprob_allowance, logprob_gap, logprob_problem  # noqa: E402
from learner.batch import collate, token_logprobs  # noqa: E402
from worker_agent.engines.base import SamplingParams  # noqa: E402
from worker_agent.engines.hf import HFEngine  # noqa: E402

PROMPTS = [  # some open, some nearly determined: a sharpened policy makes most tokens near-certain
    "Count from one to twenty: one, two, three,", "The days of the week are Monday, Tuesday,",
    "Q: What is 7 + 5?\nA:", "def fibonacci(n):\n    ", "The capital of France is", "Once upon a time, there was a",
    "1, 2, 3, 4, 5, 6,", "The alphabet: A B C D E", "Write one sentence about the sea.", "import numpy as np\nimport",
    "Q: What is the opposite of hot?\nA:", "Roses are red, violets are",
]
CLAIMS = ("honest", "constant", "rounded", "rounded-0.01", "zero", "stale")


def snapshot(state: dict[str, torch.Tensor], sharpen: float) -> dict[str, torch.Tensor]:
    """The base weights with every logit times ``sharpen`` (the final norm's weight), in bf16 as published."""
    out = {k: v.detach().clone() for k, v in state.items()}
    norm = next(k for k in out if k.endswith("model.norm.weight"))
    out[norm] = out[norm] * sharpen
    return {k: v.to(torch.bfloat16) for k, v in out.items()}


def claims(kind: str, honest: list[float], stale: list[float]) -> list[float]:
    if kind == "honest":
        return honest
    if kind == "constant":
        return [-0.01] * len(honest)
    if kind == "rounded":
        return [round(x, 1) for x in honest]
    if kind == "rounded-0.01":
        return [round(x, 2) for x in honest]
    if kind == "zero":
        return [0.0] * len(honest)
    return stale


OLD_RULE = {"logprob_share": 1.0, "logprob_tolerance": 0.05}  # the mean gap per token alone, at its old default


def sample(args: argparse.Namespace) -> list[dict]:
    """Per policy and engine: every group's token mask, claimed (the engine's), recomputed (the learner's fp32,
    under the policy) and stale (under the base) log-probs, [B, T] tensors as the learner collates them."""
    from transformers import AutoModelForCausalLM

    scorer = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()
    base = {k: v.clone() for k, v in scorer.state_dict().items()}
    engines = {"bf16": HFEngine(args.model_dir, device="cpu", seed=args.seed)}  # as agents load SmolLM2
    if "fp32" in args.engines:
        engines["fp32"] = HFEngine(args.model_dir, device="cpu", seed=args.seed)
        engines["fp32"].model.float()
    engines = {k: e for k, e in engines.items() if k in args.engines}
    pad = engines[next(iter(engines))].tokenizer.pad_token_id
    rng = random.Random(args.seed)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    saved: list[dict] = []
    for sharpen in args.sharpen:
        weights = snapshot(base, sharpen)
        scorer.load_state_dict({k: v.float() for k, v in weights.items()})
        for name, engine in engines.items():
            engine.load_weights({k: v.to(next(engine.model.parameters()).dtype) for k, v in weights.items()})
            prompts = [rng.choice(PROMPTS) for _ in range(args.groups)]
            groups = engine.generate(prompts, n=args.n, params=params)
            batches = [collate([Trajectory(job_id=1, lease_id=f"l{g}", group_id=f"g{g}", prompt=p,
                                           prompt_ids=c.prompt_ids, completion=c.text, completion_ids=c.completion_ids,
                                           logprobs=c.logprobs, reward=0.0, version=1) for c in group], pad_id=pad)
                       for g, (p, group) in enumerate(zip(prompts, groups, strict=True))]
            with torch.no_grad():
                recomputed = [token_logprobs(scorer, b) for b in batches]
                scorer.load_state_dict(base)
                stale = [token_logprobs(scorer, b) for b in batches]
                scorer.load_state_dict({k: v.float() for k, v in weights.items()})
            saved.append({"sharpen": sharpen, "engine": name, "mask": [b.token_mask for b in batches],
                          "claimed": [b.behaviour_logp for b in batches], "recomputed": recomputed, "stale": stale})
    return saved


def evaluate(saved: list[dict], settings: AuditSettings) -> Table:
    """The table: per policy, engine and claim, how many groups each rule fails."""
    old = AuditSettings(**{**settings.__dict__, **OLD_RULE})
    out = Table(title=f"Log-prob audits under engine numerics (old rule: mean gap <= {old.logprob_tolerance}; new: "
                      f"per token <= {settings.logprob_floor} + (1 - p) ({settings.logprob_nats} + "
                      f"{settings.logprob_tail_nats} (1 - p)), a group fails past "
                      f"{settings.logprob_share:.0%} of its tokens or a mean gap over {settings.logprob_tolerance})")
    for col in ("policy", "engine", "claim", "groups", "tokens", "mean logp", "|err| p99 / max",
                "allowance used, max", "mean gap, median / max", "old rule fails", "new rule fails"):
        out.add_column(col, justify="right")
    for row in saved:
        for kind in CLAIMS:
            gaps, fails_old, fails_new, errs, tokens, mean_lp, need = [], 0, 0, [], 0, [], []
            for mask, honest, r, s in zip(row["mask"], row["claimed"], row["recomputed"], row["stale"], strict=True):
                mask, where = mask.float(), mask.bool()
                claimed = honest.clone()
                claimed[where] = torch.tensor(claims(kind, honest[where].tolist(), s[where].tolist()))
                gaps.append(logprob_gap(claimed, r, mask))
                fails_old += bool(logprob_problem(claimed, r, mask, settings=old)[0])
                fails_new += bool(logprob_problem(claimed, r, mask, settings=settings)[0])
                errs.extend((claimed - r).abs()[where].tolist())
                # how much of its allowance the group's share-th worst token uses (over 1: the group fails)
                allowed = logprob_allowance(r, nats=settings.logprob_nats, floor=settings.logprob_floor,
                                            tail_nats=settings.logprob_tail_nats)
                z = ((claimed - r).abs() / allowed)[where]
                need.append(float(torch.quantile(z, 1 - settings.logprob_share)) if len(z) else 0.0)
                tokens += int(mask.sum())
                mean_lp.append(float((r * mask).sum() / mask.sum().clamp(min=1)))
            errs.sort()
            groups = len(row["mask"])
            out.add_row(f"x{row['sharpen']:g}", row["engine"], kind, str(groups), str(tokens),
                        f"{statistics.mean(mean_lp):.3f}",
                        f"{errs[min(len(errs) - 1, int(0.99 * len(errs)))]:.3g} / {errs[-1]:.3g}",
                        f"{max(need):.3g}", f"{statistics.median(gaps):.3g} / {max(gaps):.3g}",
                        f"{fails_old} of {groups}", f"{fails_new} of {groups}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="var/models/smollm2-135m-instruct")
    parser.add_argument("--groups", type=int, default=24, help="Groups sampled per policy and engine.")
    parser.add_argument("--n", type=int, default=4, help="Records per group.")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--sharpen", type=float, nargs="+", default=[1.0, 3.0, 6.0])
    parser.add_argument("--engines", nargs="+", choices=("bf16", "fp32"), default=["bf16", "fp32"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", help="Write every token's claimed, recomputed and stale log-probs here (.pt).")
    parser.add_argument("--load", nargs="+", help="Evaluate tokens saved by --save runs instead of sampling.")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    if args.load:
        saved = [row for path in args.load for row in torch.load(path)]
    else:
        saved = sample(args)
        if args.save:
            torch.save(saved, args.save)
    Console(width=220).print(evaluate(saved, AuditSettings()))
    print(f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
