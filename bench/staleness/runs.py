"""One training run of the staleness sweep: GRPO through the learner's own update (:class:`learner.step.PolicyTrainer`),
fed by a simulated pool whose records lag behind the policy, and what the run measured.

The pool (the first staleness bench's model, kept): the learner publishes a snapshot every kappa = S - 1 updates (paper
3.2); each prompt group of update t + 1 is sampled (``worker_agent.engines.hf.HFEngine``) under a version drawn
uniformly from the published versions the staleness gate admits (v >= t - S): a fleet whose workers hold a spread of
the versions they may still use, the most stale allowed included. ``staleness = 0`` is the synchronous reference:
every group is sampled from the current policy (lag 0).

A seed fixes the model's initialisation, the prompt sequence (its own generator, so every cell of one seed sees the
same prompts at the same update: runs are paired by seed) and the engine's sampling generator; which version samples
a group comes from a second generator, so it never shifts the prompts.
"""

from __future__ import annotations

import collections
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dataplane.jobs import LossConfig
from dataplane.tasks import build_task
from learner.step import PolicyTrainer
from learner.tiny import build_tiny_model
from worker_agent.engines.base import SamplingParams
from worker_agent.engines.hf import HFEngine
from worker_agent.rollout import GroupLease, rollout_groups

WINDOW = 10  # updates in the moving mean of the batch reward that must reach the target
EVAL_SAMPLES = 4  # completions per evaluation prompt


@dataclass(frozen=True)
class Setup:
    """A task and the job that trains on it: everything but S, the correction, the seed and the step cap."""

    name: str
    task: dict
    hidden: int = 64
    layers: int = 2
    groups: int = 16
    n: int = 8
    lr: float = 1e-3
    max_new_tokens: int = 2
    max_grad_norm: float = 1.0
    clip_eps: float = 0.2
    is_cap: float = 2.0
    target: float = 0.8
    steps: int = 400  # the step cap of --full
    eval_prompts: int = 0  # 0: every prompt of the task (arithmetic); else this many, fixed, drawn from the task


SETUPS = {
    # make demo's job: the tiny model (hidden 64, 2 layers), arithmetic with operands 0..4, R = 128 as 16 x 8
    "arithmetic": Setup("arithmetic", {"name": "arithmetic", "max_operand": 4}),
    # the harder task: operands 0..9, + and * (mod 10), 200 prompts; hidden 128. Measured here (seed 1, synchronous):
    # the 20-update mean batch reward 0.04 -> 0.22 by update 100, 0.21-0.25 up to 400: learning, far from a ceiling
    "arithmetic9": Setup("arithmetic9", {"name": "arithmetic", "max_operand": 9, "ops": "+*"}, hidden=128,
                         target=0.2),
    # countdown over two numbers 1..9 with + - *, a larger model (hidden 128, 4 layers): NOT in --full. From a random
    # initialisation the reward stays at 0 (measured: 30 synchronous updates, batch reward 0.000-0.003, 13 s each on
    # a loaded machine): a character model must first learn the answer format; it needs a warm start
    "countdown": Setup("countdown", {"name": "countdown", "count": 2, "max_number": 9, "max_target": 81,
                                     "ops": "+-*"}, hidden=128, layers=4, max_new_tokens=4, target=0.5,
                       steps=400, eval_prompts=64),
}


def run(setup: Setup, *, staleness: int, correction: str, seed: int, steps: int) -> dict:
    """Train ``steps`` updates under the simulated pool; the run as one JSON-able dict (its batch rewards, the
    first update at which their WINDOW-update mean reached ``setup.target`` or None, the final policy's reward)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    task = build_task(setup.task)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="staleness-") as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "m", alphabet=task.alphabet, hidden=setup.hidden,
                                         layers=setup.layers, seed=seed))
        model, trainer, engine = _trainer(model_dir, setup, correction, seed)
        published = {0: snapshot(model)}  # version -> weights, the ones the gate still admits
        prompts_rng, versions_rng = random.Random(seed), random.Random(f"versions-{seed}")
        params = SamplingParams(max_new_tokens=setup.max_new_tokens)
        rewards: list[float] = []
        lags: list[int] = []
        reached = None
        for t in range(steps):  # the policy is version t; this update makes t + 1
            if staleness == 0:
                published = {t: snapshot(model)}
            prompts = [p.text for p in task.sample_prompts(prompts_rng, setup.groups)]
            records = pool_batch(engine, task, published, prompts, versions_rng, t=t, n=setup.n, params=params)
            lags.extend(t - r.version for r in records)
            rewards.append(trainer.step(records).reward_mean)
            if reached is None and len(rewards) >= WINDOW and statistics.fmean(rewards[-WINDOW:]) >= setup.target:
                reached = t + 1
            if staleness and (t + 1) % (staleness - 1) == 0:
                published[t + 1] = snapshot(model)
            published = {v: w for v, w in published.items() if v >= t + 1 - staleness}
        final = evaluate(engine, task, snapshot(model), params, setup)
    return {"task": setup.name, "staleness": staleness, "correction": correction, "seed": seed, "steps": steps,
            "target": setup.target, "reached": reached, "final": final, "rewards": [round(r, 4) for r in rewards],
            "mean_lag": statistics.fmean(lags), "max_lag": max(lags),
            "seconds": round(time.perf_counter() - started, 1),
            "setup": asdict(setup)}


def _trainer(model_dir: str, setup: Setup, correction: str, seed: int) -> tuple[torch.nn.Module, PolicyTrainer,
                                                                                HFEngine]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(model_dir, device="cpu", seed=seed)
    loss = LossConfig(off_policy=correction, is_cap=setup.is_cap).resolved(clip_eps=setup.clip_eps,
                                                                          max_new_tokens=setup.max_new_tokens)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=setup.lr), loss,
                            pad_id=engine.tokenizer.pad_token_id, max_grad_norm=setup.max_grad_norm)
    return model, trainer, engine


def pool_batch(engine: HFEngine, task, published: dict[int, dict], prompts: list[str], rng: random.Random, *,
               t: int, n: int, params: SamplingParams) -> list:
    """``n`` samples of each prompt for update t + 1, each prompt's group under a version drawn uniformly from
    ``published`` (every one admissible: ``v >= t - S``)."""
    by_version: dict[int, list[str]] = collections.defaultdict(list)
    versions = sorted(published)
    for prompt in prompts:
        by_version[rng.choice(versions)].append(prompt)
    records = []
    for version, texts in sorted(by_version.items()):
        engine.load_weights(published[version])
        leases = [GroupLease(f"{t}-{version}-{i}", f"{t}-{version}-{i}", p) for i, p in enumerate(texts)]
        for group in rollout_groups(engine, task, leases, job_id=1, n=n, params=params, version=version):
            records.extend(group.records)
    return records


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def evaluate(engine: HFEngine, task, weights: dict, params: SamplingParams, setup: Setup) -> float:
    """Mean reward of EVAL_SAMPLES sampled completions (temperature 1, as the job samples) of each evaluation
    prompt: every prompt of arithmetic, or ``setup.eval_prompts`` drawn once from a fixed generator."""
    engine.load_weights(weights)
    if setup.eval_prompts:
        prompts = [p.text for p in task.sample_prompts(random.Random("evaluation"), setup.eval_prompts)]
    else:
        prompts = [f"{a}{op}{b}=" for op in task.ops for a in range(task.max_operand + 1)
                   for b in range(task.max_operand + 1)]
    groups = engine.generate(prompts, n=EVAL_SAMPLES, params=params)
    scores = [task.reward(p, c.text) for p, group in zip(prompts, groups, strict=True) for c in group]
    return sum(scores) / len(scores)
