"""Data-parallel training: two CPU ranks over gloo under torchrun take the same update as one process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from learner.distributed import split_rows

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent


def run(argv: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``argv`` in its own process group; on timeout kill the whole group (torchrun's ranks too)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv[0]} timed out:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_split_rows_covers_every_row_once() -> None:
    assert split_rows(5, 2) == [(0, 3), (3, 5)]
    assert split_rows(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert split_rows(15, 4) == [(0, 4), (4, 8), (8, 12), (12, 15)]


@pytest.mark.slow
def test_two_gloo_ranks_end_identical_and_equal_to_one_process(tmp_path, tiny_model_dir) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    script = str(HERE / "ddp_step.py")
    # 15 rows over 2 ranks: 8 and 7; micro-batches of 3 on each rank (gradient accumulation under no_sync)
    parallel = run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", script, str(tiny_model_dir),
                    str(tmp_path), "--micro-batch", "3"], env)
    assert parallel.returncode == 0, parallel.stderr[-3000:]
    single = run([sys.executable, script, str(tiny_model_dir), str(tmp_path), "--reference"], env)
    assert single.returncode == 0, single.stderr[-3000:]

    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    reference = torch.load(tmp_path / "single.pt")
    base = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert any(not torch.equal(reference[k], base[k]) for k in base), "the updates changed nothing"
    for name, tensor in reference.items():
        assert torch.equal(rank0[name], rank1[name]), f"ranks differ on {name}"
        torch.testing.assert_close(rank0[name], tensor, rtol=0, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
