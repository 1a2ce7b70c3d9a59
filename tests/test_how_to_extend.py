"""docs/architecture.md "How to extend" stays true: every file, folder and test it names exists, and each
registration it names is a decorator or function of the registry it points to."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## How to extend")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_every_path_the_section_names_exists() -> None:
    paths = {p for p in re.findall(r"`([\w./<>-]+\.py|[\w-]+/[\w./<>-]*)`", section()) if "/" in p}

    assert len(paths) >= 10  # it really read the table
    for path in sorted(paths):
        folder = path.split("<name>")[0] if "<name>" in path else path
        assert (ROOT / folder).exists(), f"docs/architecture.md 'How to extend' names {path}, which does not exist"


def test_every_registration_the_section_names_is_defined() -> None:
    sources = {"register_policy_loss": "learner/losses/registry.py", "declare_loss_type": "dataplane/losses.py",
               "register_task": "dataplane/tasks/base.py", "register_fault": "bench/faults/base.py"}
    for name, path in sources.items():
        assert name in section()
        assert f"def {name}(" in (ROOT / path).read_text()
