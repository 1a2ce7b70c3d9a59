"""Small factories for marketplace objects (plain functions: the models are few and simple)."""

from __future__ import annotations

import itertools
import os
import tempfile
from decimal import Decimal
from pathlib import Path

from django.contrib.auth.models import User

from dataplane.jobs import parse_job_spec
from marketplace import services

_seq = itertools.count(1)


def user(name: str | None = None, **extra) -> User:
    return User.objects.create_user(name or f"user{next(_seq)}", password="pw-12345678", **extra)


def token(for_user: User) -> str:
    """A new API token of ``for_user`` (tokens are stored hashed: each call makes another, the older keep working)."""
    return services.api_token_issue(user=for_user, replace=False)


def worker(owner: User, *, price: str = "0.35", name: str | None = None):
    """Returns (worker, agent_key)."""
    return services.worker_register(user=owner, name=name or f"rig{next(_seq)}", gpu="test-gpu",
                                    price_per_hour=Decimal(price), bandwidth_bps=12_500_000)


def checkpoint_dir(name: str = "tiny") -> str:
    """A checkpoint directory the site can see (it checks a job's ``model_dir`` exists; only the learner loads it)."""
    path = Path(tempfile.gettempdir()) / f"echo2-test-models-{os.getuid()}" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").touch()
    return str(path)


def job(owner: User, model_dir: str | None = None, **fields):
    spec = parse_job_spec({"name": "test job", "model_dir": model_dir or checkpoint_dir(),
                           "task": {"name": "arithmetic"}, "batch_trajectories": 8, "group_size": 4, **fields})
    return services.job_create(owner=owner, spec=spec)


def manifest(job, version: int, *, total_bytes: int = 16) -> dict:
    """A well-formed manifest of ``version`` of ``job``, as its learner publishes it (the site checks the shape)."""
    from dataplane.snapshot import build_manifest

    return build_manifest(bytes(total_bytes), job_id=job.pk, version=version).model_dump(mode="json")
