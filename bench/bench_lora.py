"""LoRA jobs against full fine-tuning (docs/lora.md): bytes per publication, learner step time and memory, and the
broadcast time those bytes cost on the ``paper`` WAN profile.

Run: ``.venv/bin/python bench/bench_lora.py [--model DIR] [--steps 3] [--wire] [--json PATH]``, or the wire part
alone for given sizes: ``bench/bench_lora.py --wire-bytes r8=4886480 full=269030016``, or the reward curves of
full and LoRA jobs on the tiny model: ``bench/bench_lora.py --curves [--curve-steps 120] [--seeds 0 1]``

For each configuration (full fine-tuning at lr 1e-6 and 1e-5; LoRA rank 8 and 32 at lr 1e-4 on every linear layer
of the blocks) a fresh process builds the learner's policy exactly as the learner does (``learner.policy.build_policy``
from a JobSpec), trains ``--steps`` GRPO updates on the same on-policy batch (16 sequences, fixed seed) and publishes
each version through the learner's ``SnapshotStore`` (bf16, lossless deltas where they pay), then reports: the bytes
of each publication (v1 has no delta base; v2.. are deltas where they pay), the median step time, the process's peak
resident memory, and the training state (parameters, gradients and AdamW's moments, counted from the tensors).

``--wire`` also sends payloads of those sizes along the ``paper`` profile's chains (N = 8 agents at 50 Mbit/s, 2 chains,
40 ms round trips; bench/wan/wire.py: the relays of the learner and the agents in network namespaces, no site, no
training), needs root, and prints T_bcast beside M/Bw and the floor of docs/wan.md "The floor at N = 8".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMOLLM2 = ROOT / "var" / "models" / "smollm2-135m-instruct"
CONFIGS = {"full lr 1e-6": {"learning_rate": 1e-6}, "full lr 1e-5": {"learning_rate": 1e-5},
           "lora r8": {"learning_rate": 1e-4, "lora": {"rank": 8}},
           "lora r32": {"learning_rate": 1e-4, "lora": {"rank": 32}}}
PAPER_BW = 50e6 / 8  # the paper profile's worker link, bytes/s
TCP = 1514 / 1448  # docs/wan.md: a payload's share of a frame under tbf
FIRST_BYTE_S, HOPS, PART_BYTES, HOP_DELAY_S = 0.055, 3, 64 << 10, 0.040


def floor_s(size: int, bw: float = PAPER_BW) -> float:
    """docs/wan.md "The floor at N = 8": no relay delivers M down a chain of 4 sooner."""
    return TCP * size / bw + FIRST_BYTE_S + HOPS * (PART_BYTES / bw + HOP_DELAY_S)


def batch(tokenizer, policy, *, seed: int = 0):
    """16 on-policy sequences (4 groups of 4): prompts the tokenizer formats, completions of 32 sampled token ids,
    rewards 0/1, behaviour log-probs the policy's own (ratio 1: the first update is a plain policy gradient)."""
    import torch

    from dataplane.records import Trajectory
    from learner.batch import collate, token_logprobs

    gen = torch.Generator().manual_seed(seed)
    out = []
    for g, question in enumerate(["What is 12 + 30?", "Name a prime above 10.", "What is 7 x 6?", "Spell cat."]):
        prompt_ids = tokenizer(question)["input_ids"]
        for k in range(4):
            high = min(len(tokenizer), 20_000)
            completion = torch.randint(min(100, high // 2), high, (32,), generator=gen).tolist()
            out.append(Trajectory(job_id=1, lease_id=f"l{g}", group_id=f"g{g}", prompt=question, prompt_ids=prompt_ids,
                                  completion="x", completion_ids=completion, logprobs=[-1.0] * 32,
                                  reward=float((k + g) % 2), version=0))
    rows = collate(out, pad_id=tokenizer.pad_token_id or 0)
    with torch.no_grad():
        logp = token_logprobs(policy.eval(), rows)
    return [r.model_copy(update={"logprobs": logp[i, len(r.prompt_ids) - 1:len(r.prompt_ids) + 31].tolist()})
            for i, r in enumerate(out)]


def state_bytes(trainer) -> dict[str, int]:
    params = sum(p.numel() * p.element_size() for p in trainer.module.parameters())
    trained = [p for p in trainer.module.parameters() if p.requires_grad]
    grads = sum(p.numel() * p.element_size() for p in trained)
    moments = sum(t.numel() * t.element_size() for s in trainer.optimizer.state.values() for t in s.values()
                  if hasattr(t, "numel") and t.dim() > 0)
    return {"params_bytes": params, "trainable": sum(p.numel() for p in trained), "grads_bytes": grads,
            "optimizer_bytes": moments}


def one(model_dir: str, name: str, steps: int) -> dict:
    """One configuration, in this process (the parent runs each in its own, for a clean peak RSS)."""
    import torch

    from dataplane.jobs import JobSpec
    from learner.policy import build_policy
    from learner.snapshots import SnapshotStore

    torch.manual_seed(0)
    spec = JobSpec(name=name, model_dir=model_dir, task={"name": "arithmetic"}, batch_trajectories=16, group_size=4,
                   max_new_tokens=32, **CONFIGS[name])
    trainer, tokenizer = build_policy(spec, device="cpu")
    records = batch(tokenizer, trainer.module)
    with tempfile.TemporaryDirectory() as root:
        store = SnapshotStore(Path(root), job_id=1, adapter=spec.lora)
        times, pubs = [], []
        for version in range(1, steps + 1):
            started = time.perf_counter()
            trainer.step(records)
            times.append(time.perf_counter() - started)
            manifest = store.write(trainer.full_state(), version)
            pubs.append({"version": version, "kind": manifest.kind, "bytes": manifest.total_bytes,
                         "full_bytes": (manifest.full or manifest).total_bytes})
    return {"config": name, "step_s": statistics.median(times), "step_times": times, "publications": pubs,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **state_bytes(trainer)}


CURVES = {"full lr 1e-3": (0, 1e-3), "lora r8 lr 1e-3": (8, 1e-3), "lora r8 lr 1e-2": (8, 1e-2),
          "lora r32 lr 1e-2": (32, 1e-2)}


def curve(name: str, *, steps: int, seed: int, root: Path) -> list[float]:
    """The batch mean reward of each of ``steps`` updates of examples/jobs/arithmetic.toml's job on a fresh tiny model
    (seed ``seed``): the agent's rollout on the HF engine, the learner's update from ``build_policy``, and after each
    update the engine given the new version as a worker installs it (the weights, or the adapter alone)."""
    import random

    import torch

    from dataplane.jobfiles import load_job_file
    from dataplane.jobs import parse_job_spec
    from dataplane.packed import pack_records
    from dataplane.tasks import build_task
    from learner import lora
    from learner.batch import concat
    from learner.policy import build_policy
    from learner.tiny import build_tiny_model
    from worker_agent.engines.base import SamplingParams
    from worker_agent.engines.hf import HFEngine
    from worker_agent.rollout import GroupLease, rollout_groups

    rank, lr = CURVES[name]
    raw = load_job_file(ROOT / "examples" / "jobs" / "arithmetic.toml")
    task = build_task(raw["task"])
    model_dir = build_tiny_model(root / f"seed{seed}", alphabet=task.alphabet, seed=seed)
    spec = parse_job_spec({**raw, "model_dir": str(model_dir), "seed": seed, "learning_rate": lr,
                           "lora": {"rank": rank}})
    torch.manual_seed(seed)
    trainer, _ = build_policy(spec, device="cpu")
    engine = HFEngine(str(model_dir), device="cpu", seed=seed)
    rng, params, rewards = random.Random(seed), SamplingParams(max_new_tokens=spec.max_new_tokens), []
    for t in range(steps):
        prompts = task.sample_prompts(rng, spec.groups_per_step)
        leases = [GroupLease(f"{t}-{i}", f"{t}-{i}", p.text) for i, p in enumerate(prompts)]
        groups = rollout_groups(engine, task, leases, job_id=1, n=spec.group_size, params=params, version=t)
        rewards.append(trainer.step(concat(pack_records(g.records) for g in groups)).reward_mean)
        state = trainer.module.state_dict()
        if rank:
            engine.load_adapter(lora.adapter_state(state), spec.lora, version=t + 1)
        else:
            engine.load_weights({k: v.detach().clone() for k, v in state.items()})
    return rewards


def wire(sizes: dict[str, int], workdir: Path, rounds: int) -> list[dict]:
    from bench.wan import netns, profile
    from bench.wan.wire import run_wire
    from dataplane.broadcast.framing import DEFAULT_PART_BYTES
    from dataplane.snapshot import DEFAULT_CHUNK_BYTES

    reason = netns.unavailable()
    if reason:
        print(f"wire: skipped ({reason})")
        return []
    topology = profile.load("paper")
    rows = []
    for label, size in sizes.items():
        row = run_wire(topology, workdir / label.replace(" ", "-"), size=size, chunk=DEFAULT_CHUNK_BYTES,
                       part_bytes=DEFAULT_PART_BYTES, rounds=rounds)
        rows.append({"what": label, "m_bytes": size, "m_over_bw_s": row["m_over_bw_s"], "t_bcast_s": row["t_bcast_s"],
                     "t_all_s": row["t_all_s"], "floor_s": floor_s(size), "ratios": row["ratios"]})
    return rows


def run_curves(args) -> int:
    """Each configuration of :data:`CURVES` on each seed, torch on one thread; the table, and the curves as JSON."""
    import torch

    torch.set_num_threads(1)
    out: dict[str, dict[int, list[float]]] = {}
    with tempfile.TemporaryDirectory() as root:
        for name in CURVES:
            out[name] = {seed: curve(name, steps=args.curve_steps, seed=seed, root=Path(root) / name.replace(" ", "-"))
                         for seed in args.seeds}
    window = 10
    print(f"examples/jobs/arithmetic.toml, tiny model, {args.curve_steps} updates, seeds {args.seeds}: mean batch "
          f"reward of the first and last {window} updates\n")
    print("| config | " + " | ".join(f"seed {s} first / last" for s in args.seeds) + " | last, mean of seeds |")
    print("| --- | " + " | ".join("---" for _ in args.seeds) + " | --- |")
    for name, by_seed in out.items():
        cells = [f"{statistics.fmean(r[:window]):.3f} / {statistics.fmean(r[-window:]):.3f}" for r in by_seed.values()]
        last = statistics.fmean(statistics.fmean(r[-window:]) for r in by_seed.values())
        print(f"| {name} | " + " | ".join(cells) + f" | {last:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"curves": out}, indent=1))
    return 0


def print_wire(wired: list[dict]) -> None:
    if not wired:
        return
    print("\n| publication | M MB | M/Bw s | T_bcast s (median) | T_all s | floor s | T_bcast/(M/Bw) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for w in wired:
        print(f"| {w['what']} | {w['m_bytes'] / 1e6:.2f} | {w['m_over_bw_s']:.2f} | {w['t_bcast_s']:.2f} | "
              f"{w['t_all_s']:.2f} | {w['floor_s']:.2f} | {w['t_bcast_s'] / w['m_over_bw_s']:.2f} |")


def print_results(results: list[dict], args) -> dict[str, int]:
    """The bytes and the step's table, then M/Bw and the floor of each publication; returns the sizes by label."""
    print(f"model {args.model}, {args.steps} updates per configuration, bf16 publications\n")
    print("| config | trainable params | v1 bytes | v2.. bytes (kind) | step s | peak RSS MB | grads + AdamW MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        later = ", ".join(f"{p['bytes'] / 1e6:.2f} MB ({p['kind']})" for p in r["publications"][1:])
        print(f"| {r['config']} | {r['trainable']:,} | {r['publications'][0]['bytes'] / 1e6:.2f} MB | {later} | "
              f"{r['step_s']:.2f} | {r['peak_rss_bytes'] / 1e6:.0f} | "
              f"{(r['grads_bytes'] + r['optimizer_bytes']) / 1e6:.1f} |")
    sizes = {}
    for r in results:
        pubs = r["publications"]
        sizes[f"{r['config']} v1"] = pubs[0]["bytes"]
        if len(pubs) > 1:
            sizes[f"{r['config']} v2+"] = int(statistics.median(p["bytes"] for p in pubs[1:]))
    print("\n| publication | M MB | M/Bw s (50 Mbit/s) | floor s (N = 8 chain) |")
    print("| --- | --- | --- | --- |")
    for label, size in sizes.items():
        print(f"| {label} | {size / 1e6:.2f} | {size / PAPER_BW:.2f} | {floor_s(size):.2f} |")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(SMOLLM2) if SMOLLM2.is_dir() else None,
                        help="A Hugging Face model directory (default: SmolLM2-135M-Instruct under var/models).")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--wire", action="store_true", help="Also time the payloads on the paper profile (root).")
    parser.add_argument("--wire-rounds", type=int, default=3)
    parser.add_argument("--wire-bytes", nargs="+", metavar="LABEL=BYTES", help="Only the wire part, for these "
                        "payload sizes (no training): e.g. r8=4886480 full=269030016.")
    parser.add_argument("--workdir", type=Path, default=ROOT / "var" / "bench-lora")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--curves", action="store_true", help="Only the reward curves: examples/jobs/arithmetic.toml "
                        "on the tiny model, full against LoRA, the same seeds and updates.")
    parser.add_argument("--curve-steps", type=int, default=120)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model is None and not (args.wire_bytes or args.curves):
        parser.error("--model: no SmolLM2 under var/models; give a model directory (echo2-learner init-model)")
    if args.one:
        print(json.dumps(one(args.model, args.one, args.steps)))
        return 0
    if args.curves:
        return run_curves(args)
    if args.wire_bytes:
        sizes = {label: int(size) for label, _, size in (item.partition("=") for item in args.wire_bytes)}
        print_wire(wire(sizes, args.workdir, args.wire_rounds))
        return 0
    results = []
    for name in args.configs:
        done = subprocess.run([sys.executable, __file__, "--model", args.model, "--steps", str(args.steps),
                               "--one", name], capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        if done.returncode:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        if args.json:  # each configuration kept as it ends: a run cut short still has the ones done
            args.json.write_text(json.dumps({"model": args.model, "results": results}, indent=1))
    sizes = print_results(results, args)
    wired = []
    if args.wire:
        wanted = {k: v for k, v in sizes.items() if k.startswith("lora") or k == "full lr 1e-6 v1"}
        wired = wire(wanted, args.workdir, args.wire_rounds)
        print_wire(wired)
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "results": results, "wire": wired}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
