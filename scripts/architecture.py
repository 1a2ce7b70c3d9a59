"""Draw docs/architecture.png: the planes (one package each), their modules sized by lines, and the import
arrows between planes, read from the code's own imports (the same parser as tests/test_layering.py).

    .venv/bin/python scripts/architecture.py [--out docs/architecture.png]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_layering import import_graph, modules  # noqa: E402

# (x, y, width, height) of each plane on a 16 x 10 canvas, and its colour
PLANES = {
    "echo2_site": ((4.0, 8.6, 8.0, 1.0), "#e8c5e0", "Django project: settings, urls, ASGI, Celery app, demo"),
    "frontend": ((0.2, 6.6, 4.6, 1.5), "#c3e6e3", "dashboard and provider portal"),
    "echo2_cli": ((5.1, 6.6, 3.4, 1.5), "#f3e3c3", "the owner's CLI over the REST API"),
    "simulator": ((8.8, 6.6, 7.0, 1.5), "#e3e3e3", "discrete-event fleet simulator over the pure cores"),
    "marketplace": ((0.2, 2.9, 7.2, 3.3), "#c4d7ea", "control plane in rooms: core/ (pure), api/, realtime/, infra/, "
                    "services/, models"),
    "learner": ((7.7, 2.9, 4.0, 3.3), "#f0cdd5", "learning plane: GRPO, staleness gate, checkpoints, publisher"),
    "worker_agent": ((12.0, 2.9, 3.8, 3.3), "#cdebcf", "rollout plane: echo2-agent, engines, rollouts"),
    "dataplane": ((0.2, 0.3, 15.6, 2.1), "#d8d0ec", "what flows between planes: records, replay buffer, snapshots, "
                  "broadcast relay, messages, job spec, tasks"),
}


def plane_of(module: str) -> str:
    return module.split(".")[0]


def _room(module: str) -> str:
    """A sub-package counts as one room (``dataplane.tasks``), a module as itself."""
    parts = module.split(".")
    return ".".join(parts[:2])


def draw(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    sizes: Counter[str] = Counter()
    for name, path in modules():
        sizes[_room(name)] += len(path.read_text().splitlines())
    arrows: Counter[tuple[str, str]] = Counter()
    for source, targets in import_graph().items():
        for target in targets:
            if plane_of(source) != plane_of(target):
                arrows[(plane_of(source), plane_of(target))] += 1

    fig, ax = plt.subplots(figsize=(16, 10))
    ax.set_xlim(0, 16)
    ax.set_ylim(0, 10)
    ax.axis("off")
    for plane, ((x, y, w, h), colour, note) in PLANES.items():
        total = sum(n for room, n in sizes.items() if plane_of(room) == plane)
        ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="#333", lw=1.2))
        ax.text(x + 0.08, y + h - 0.08, f"{plane}/  ({total} lines)", va="top", fontsize=11, weight="bold")
        ax.text(x + 0.08, y + h - 0.38, note, va="top", fontsize=7.5, style="italic")
        rooms = sorted(((n, r) for r, n in sizes.items() if plane_of(r) == plane), reverse=True)
        per_row = max(1, int(w // 1.25))
        for i, (n, room) in enumerate(rooms):
            rx, ry = x + 0.08 + (i % per_row) * (w - 0.16) / per_row, y + h - 0.75 - (i // per_row) * 0.32
            label = room.split(".", 1)[1] if "." in room else "__init__"
            ax.text(rx, ry, f"{label} {n}", va="top", fontsize=6.5, family="monospace")
    for (a, b), n in sorted(arrows.items()):
        (ax_, ay, aw, ah), _, _ = PLANES[a]
        (bx, by, bw, bh), _, _ = PLANES[b]
        start = (ax_ + aw / 2, ay if by < ay else ay + ah)
        end = (bx + bw / 2, by + bh if by < ay else by)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=0.6 + 0.12 * min(n, 20),
                                     color="#555", connectionstyle="arc3,rad=0.08"))
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2, str(n), fontsize=8, color="#a00")
    ax.set_title("ECHO-2: one package per plane; arrows are imports between planes (number = import edges), "
                 "drawn from the code", fontsize=11)
    fig.savefig(out, dpi=100, bbox_inches="tight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "architecture.png")
    args = parser.parse_args()
    draw(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
