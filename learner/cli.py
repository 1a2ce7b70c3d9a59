"""``echo2-learner``: train a job, or build a tiny model for tests and demos.

\b
Examples:
  echo2-learner --server http://127.0.0.1:8000 --job 3 --token $TOKEN
  echo2-learner init-model var/tiny-arith --task arithmetic
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, rich_markup_mode=None)


@app.command()
def run(
    server: Annotated[str, typer.Option(envvar="ECHO2_SERVER", help="Site URL, e.g. http://127.0.0.1:8000.")],
    job: Annotated[int, typer.Option(envvar="ECHO2_JOB", help="Job id to train.")],
    token: Annotated[str, typer.Option(envvar="ECHO2_TOKEN", help="The job owner's API token.")],
    redis_url: Annotated[str, typer.Option("--redis", envvar="REDIS_URL", help="Redis with the job's streams.")]
    = "redis://127.0.0.1:6379/0",
    snapshot_dir: Annotated[Path, typer.Option(help="Where snapshots are written.")] = Path("var/snapshots"),
    snapshot_host: Annotated[str, typer.Option(help="Address the snapshot server binds.")] = "127.0.0.1",
    snapshot_port: Annotated[int, typer.Option(help="Port of the snapshot server (0: any free port).")] = 0,
    advertise_host: Annotated[str | None, typer.Option(help="Host agents use to reach the snapshot server.")] = None,
    relay: Annotated[bool, typer.Option(help="Serve snapshots to chain seeds over a relay port (strategy chain; "
                                        "docs/broadcast.md). HTTP stays the fallback.")] = True,
    relay_port: Annotated[int, typer.Option(help="Port of the relay hub (0: any free port).")] = 0,
    data_timeout: Annotated[float, typer.Option(help="Fail the job after this many seconds without data.")] = 300.0,
    device: Annotated[str, typer.Option(help="torch device: cpu, cuda, cuda:1 ... (under torchrun: cpu or cuda; "
                                         "each rank takes cuda:LOCAL_RANK).")] = "cpu",
    checkpoint_dir: Annotated[Path | None, typer.Option(help="Where checkpoints go (default: "
                                                        "<snapshot-dir>/job<ID>-checkpoint); a restart resumes "
                                                        "from here.")] = None,
    checkpoint_every: Annotated[int | None, typer.Option(min=1, help="Checkpoint period in steps (default kappa; "
                                                         "publication steps always checkpoint).")] = None,
    micro_batch: Annotated[int | None, typer.Option(min=1, help="Rows per forward/backward on each rank "
                                                    "(gradient accumulation).")] = None,
    bf16: Annotated[bool, typer.Option(help="bf16 autocast of the forward passes (CUDA only).")] = False,
    site_timeout: Annotated[float, typer.Option(min=1.0, help="Seconds per site request; 5 retries, then the "
                                                "learner gives up.")] = 15.0,
    debug: Annotated[bool, typer.Option(help="Show full tracebacks.")] = False,
) -> None:
    """Train one job: read its trajectories from Redis, take GRPO steps, publish snapshots.

    \b
    A restarted learner resumes from its checkpoint. Data-parallel on 2 GPUs:
      torchrun --nproc-per-node 2 -m learner.cli --server URL --job 3 --token $TOKEN --device cuda
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s learner: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from .client import SiteClient, SiteError
    from .trainer import LearnerOptions, run_job

    options = LearnerOptions(redis_url=redis_url, snapshot_dir=snapshot_dir, snapshot_host=snapshot_host,
                             snapshot_port=snapshot_port, advertise_host=advertise_host, relay=relay,
                             relay_port=relay_port, data_timeout_s=data_timeout,
                             device=device, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                             micro_batch=micro_batch, bf16=bf16)
    site = SiteClient(server, token, timeout=site_timeout)
    try:
        status = run_job(site, job, options)
    except SiteError as err:
        _fail(str(err), debug)
    except KeyboardInterrupt:
        _fail("interrupted", debug)
    except Exception as err:  # one clear line; the traceback with --debug
        _fail(f"{type(err).__name__}: {err}", debug)
    finally:
        site.close()
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for the job
        typer.echo(f"job {job}: {status}")


@app.command("init-model")
def init_model(
    directory: Annotated[Path, typer.Argument(help="Directory to write (Hugging Face layout).")],
    task: Annotated[str, typer.Option(help="Task whose alphabet the tokenizer covers.")] = "arithmetic",
    hidden: Annotated[int, typer.Option(min=8, help="Hidden size.")] = 64,
    layers: Annotated[int, typer.Option(min=1, help="Transformer layers.")] = 2,
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
) -> None:
    """Build a tiny randomly initialised Llama model and character tokenizer (no download)."""
    from dataplane.tasks import TaskSpecError, build_task

    from .tiny import build_tiny_model

    try:
        adapter = build_task({"name": task})
    except TaskSpecError as err:
        _fail(str(err), False)
    path = build_tiny_model(directory, alphabet=adapter.alphabet, hidden=hidden, layers=layers, seed=seed)
    typer.echo(json.dumps({"model_dir": str(path.resolve())}))


def _fail(message: str, debug: bool) -> None:
    if debug:
        raise
    typer.echo(f"echo2-learner: error: {message}", err=True)
    raise typer.Exit(1)


def main() -> None:
    # `echo2-learner --server ... --job ...` is `run`: the command most users type.
    args = sys.argv[1:]
    if args and args[0].startswith("--") and args[0] not in ("--help", "-h"):
        sys.argv.insert(1, "run")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()


if __name__ == "__main__":  # torchrun -m learner.cli ...
    main()
