"""The planes stay apart (docs/architecture.md, DESIGN.md): every import of every module, inside functions too,
is read from the source and checked against what its room may import (``MAY_IMPORT``: an allow-list, so a new
edge between rooms is a decision someone writes down here); the import graphs of our packages and of bench/ have
no cycle; modules and functions stay small enough to read. A second check imports the agent and the learner for
real and looks at what they pulled in."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dataplane", "learner", "worker_agent", "marketplace", "frontend", "echo2_site", "echo2_cli",
            "simulator")
SITE_ONLY = {"django", "rest_framework", "drf_spectacular", "channels", "channels_redis", "celery", "daphne",
             "marketplace", "frontend", "echo2_site"}

# Libraries a room must ask for: the frameworks that tie code to the site, Redis, or a GPU box. Any other library
# (numpy, pydantic, httpx...) is free to all.
FRAMEWORKS: dict[str, set[str]] = {
    "django": {"django", "knox", "axes"},
    "drf": {"rest_framework", "drf_spectacular"},
    "channels": {"channels", "channels_redis", "daphne"},
    "celery": {"celery"},
    "redis": {"redis"},
    "torch": {"torch", "transformers", "safetensors", "peft", "vllm"},
}
# Room -> what its modules may import: rooms (or single modules) of ours, and frameworks. A module belongs to the
# longest room its name starts with; a room may always import itself. Read top to bottom, the site's rooms are
# layered: core (pure) < models < infra < reads < services < api, realtime < the Django shells.
MAY_IMPORT: dict[str, set[str]] = {
    # what flows between planes: nothing of ours outside itself, no framework; only the replay buffer speaks Redis
    "dataplane": {"dataplane.replay"},
    "dataplane.replay": {"dataplane", "redis"},
    "dataplane.redis_async": {"dataplane", "redis"},  # the event loop's client the site's socket calls the buffer on
    # the learning plane: the data plane and torch, never the agent or the site
    "learner": {"dataplane", "dataplane.replay", "torch"},
    # the agent installs on a GPU box that has never seen the site: no Redis (not even the replay buffer's client)
    "worker_agent": {"dataplane", "torch"},
    # the owner's CLI speaks the REST API over httpx and reads job files
    "echo2_cli": {"dataplane"},
    # the fleet simulator runs the site's pure cores and the chain code the site plans with, nothing else of ours
    "simulator": {"marketplace.core", "dataplane.broadcast.chains", "dataplane.broadcast.strategies"},
    # the site's rooms: pure cores (plain functions over plain data, the simulator runs them as the site does)
    "marketplace.core": {"dataplane"},
    "marketplace.models": {"dataplane", "django"},
    # what the site leans on: Redis, limits, probes; no reads, no API, no websocket
    "marketplace.infra": {"marketplace.core", "dataplane", "dataplane.replay", "django", "redis"},
    # the site's decoding of text audits with the job's tokenizer, in a process of its own (infra/job_tokenizer.py)
    "marketplace.infra.tokenizer_child": {"marketplace.core", "dataplane", "torch"},
    # reads: they write nothing, so they import no service
    "marketplace.reads": {"marketplace.core", "marketplace.models", "marketplace.infra", "dataplane", "django"},
    # writes by sub-domain; every push to clients after commit (channels), tasks queued by name (celery)
    "marketplace.services": {"marketplace.core", "marketplace.models", "marketplace.infra", "marketplace.reads",
                             "dataplane", "dataplane.replay", "django", "channels", "celery"},
    # the two doors: the REST API (DRF, no websocket) and the agents' websocket (Channels, no DRF); neither
    # imports the other
    "marketplace.api": {"marketplace.core", "marketplace.models", "marketplace.infra", "marketplace.reads",
                        "marketplace.services", "dataplane", "dataplane.replay", "django", "drf"},
    "marketplace.realtime": {"marketplace.core", "marketplace.models", "marketplace.infra", "marketplace.reads",
                             "marketplace.services", "dataplane", "dataplane.replay", "django", "channels"},
    # Django's shells at the root (models/ aside): tasks, admin, urls, apps, management commands
    "marketplace": {"marketplace.models", "marketplace.infra", "marketplace.reads", "marketplace.services",
                    "marketplace.api", "dataplane", "django", "drf", "celery"},
    # the dashboard: reads and services like the API, whose sample query it shares
    "frontend": {"marketplace.models", "marketplace.reads", "marketplace.services", "marketplace.api.samples",
                 "dataplane", "django", "channels"},
    # the Django project: settings, urls, ASGI routing, the Celery app, the demo
    "echo2_site": {"marketplace", "frontend", "dataplane", "django", "drf", "channels", "celery"},
    # benches drive the planes as a user would: the planes themselves, the demo site, and the site's parts they time
    "bench": {"dataplane", "dataplane.replay", "learner", "worker_agent", "simulator", "echo2_site.demo",
              "marketplace.core", "marketplace.models", "marketplace.infra", "marketplace.reads",
              "marketplace.services", "marketplace.realtime", "django", "channels", "redis", "torch"},
}
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 60


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> Iterator[tuple[str, Path]]:
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path


def import_statements(name: str, path: Path) -> Iterator[tuple[str, list[str]]]:
    """Each import of module ``name``, anywhere in its source (functions and ``if`` blocks too), as (the module
    named, absolute; the names taken from it, empty for a plain ``import``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base, [alias.name for alias in node.names]


def imports_of(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, absolute; ``from pkg import x`` counts ``pkg`` and ``pkg.x`` (x may be a
    module)."""
    found: set[str] = set()
    for base, names in import_statements(name, path):
        found.add(base)
        found.update(f"{base}.{n}" for n in names)
    return found


def room_of(name: str) -> str | None:
    """The room ``name`` belongs to: the longest key of ``MAY_IMPORT`` it is, or starts with."""
    return max((room for room in MAY_IMPORT if name == room or name.startswith(room + ".")), key=len, default=None)


def edges_of(name: str, path: Path, ours: set[str]) -> set[str]:
    """What ``name`` imports, anywhere in its source: ``from package import module`` is an edge to the module,
    ``from module import name`` one to the module, and a bench script's bare sibling (``import sim_wan``) is
    ``bench.sim_wan``."""
    def spelled(target: str) -> str:
        return f"bench.{target}" if name.startswith("bench.") and f"bench.{target}" in ours else target

    found: set[str] = set()
    for base, names in import_statements(name, path):
        base = spelled(base)
        found.update({f"{base}.{n}" if f"{base}.{n}" in ours else base for n in names} or {base})
    return found


def violations(root: Path = ROOT, packages: tuple[str, ...] = (*PACKAGES, "bench")) -> list[str]:
    """Every import a module's room does not allow (``MAY_IMPORT``), and every module in no room."""
    found = dict(modules(root, packages))
    ours_tops = {*PACKAGES, "bench"}
    ours = {name for name, _ in modules(root, tuple(ours_tops))}
    out = []
    for name, path in found.items():
        room = room_of(name)
        if room is None:
            out.append(f"{name} is in no room of MAY_IMPORT")
            continue
        allowed = MAY_IMPORT[room]
        for target in sorted(edges_of(name, path, ours)):
            top = target.split(".")[0]
            if top in ours_tops:
                ok = room_of(target) == room or any(target == a or target.startswith(a + ".") for a in allowed)
            else:
                framework = next((f for f, tops in FRAMEWORKS.items() if top in tops), None)
                ok = framework is None or framework in allowed
            if not ok:
                out.append(f"{name} imports {target} (not from {room})")
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (a ``from package import name`` edge goes to the package
    unless ``name`` is a module)."""
    ours = dict(modules(root))
    return {name: {t for t in imports_of(name, path) if t in ours and t != name} for name, path in ours.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path (first == last), or None. Packages importing their own
    submodules (``__init__`` re-exports) are not cycles of the design and are left out."""
    edges = {a: {b for b in bs if not b.startswith(a + ".") and not a.startswith(b + ".")} for a, bs in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_plane_imports_what_it_must_not() -> None:
    assert violations() == []


def test_a_planted_import_from_learner_into_the_agent_is_caught(tmp_path: Path) -> None:
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "__init__.py").write_text("")
    (tmp_path / "learner" / "sneaky.py").write_text(
        "import torch\n\n\ndef helper():\n    if True:\n        from worker_agent.relay import SnapshotRelay\n"
        "    return SnapshotRelay\n")
    (tmp_path / "learner" / "relative.py").write_text("def f():\n    from ..worker_agent import session\n")
    (tmp_path / "learner" / "cache.py").write_text("import redis\n")
    (tmp_path / "worker_agent").mkdir()
    (tmp_path / "worker_agent" / "session.py").write_text("")

    found = violations(tmp_path, ("learner",))

    assert "learner.sneaky imports worker_agent.relay (not from learner)" in found
    assert "learner.relative imports worker_agent.session (not from learner)" in found
    assert "learner.cache imports redis (not from learner)" in found
    assert not any(v.startswith("learner.sneaky imports torch") for v in found)  # the learner may use torch


def test_a_planted_import_across_the_site_rooms_is_caught(tmp_path: Path) -> None:
    for room in ("", "core", "api", "infra", "services", "realtime", "reads"):
        (tmp_path / "marketplace" / room).mkdir(parents=True, exist_ok=True)
        (tmp_path / "marketplace" / room / "__init__.py").write_text("")
    (tmp_path / "marketplace" / "core" / "pricing.py").write_text("from django.db import models\n"
                                                                  "from ..models import Job\n")
    (tmp_path / "marketplace" / "infra" / "probe.py").write_text("def f():\n    from ..reads import selectors\n")
    (tmp_path / "marketplace" / "api" / "push.py").write_text("from channels.layers import get_channel_layer\n")
    (tmp_path / "marketplace" / "services" / "rollouts.py").write_text("from ..realtime import assembly\n")
    (tmp_path / "marketplace" / "realtime" / "consumers.py").write_text("from ..api import throttling\n"
                                                                        "from ..reads import selectors\n")
    (tmp_path / "marketplace" / "reads" / "queue.py").write_text("from .. import tasks\nfrom .. import services\n")
    for module in ("tasks", "reads/selectors", "api/throttling", "realtime/assembly"):
        (tmp_path / "marketplace" / f"{module}.py").write_text("")

    found = violations(tmp_path, ("marketplace",))

    assert set(found) == {
        "marketplace.core.pricing imports django.db (not from marketplace.core)",
        "marketplace.core.pricing imports marketplace.models (not from marketplace.core)",
        "marketplace.infra.probe imports marketplace.reads.selectors (not from marketplace.infra)",
        "marketplace.api.push imports channels.layers (not from marketplace.api)",
        "marketplace.services.rollouts imports marketplace.realtime.assembly (not from marketplace.services)",
        "marketplace.realtime.consumers imports marketplace.api.throttling (not from marketplace.realtime)",
        "marketplace.reads.queue imports marketplace.tasks (not from marketplace.reads)",
        "marketplace.reads.queue imports marketplace.services (not from marketplace.reads)",
    }  # the websocket's read of a selector is allowed


def test_a_planted_import_from_a_bench_or_the_data_plane_is_caught(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench_x.py").write_text("import sim_x\nfrom marketplace.api import views\n")
    (tmp_path / "bench" / "sim_x.py").write_text("import torch\nfrom learner import grpo\n")
    (tmp_path / "dataplane").mkdir()
    (tmp_path / "dataplane" / "__init__.py").write_text("")
    (tmp_path / "dataplane" / "records.py").write_text("import torch\nfrom . import replay\nfrom learner import step\n")
    for module in ("dataplane/replay", "learner/step", "marketplace/api/views"):
        (tmp_path / f"{module}.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{module}.py").write_text("")

    found = violations(tmp_path, ("bench", "dataplane"))

    assert set(found) == {"bench.bench_x imports marketplace.api.views (not from bench)",
                          "dataplane.records imports torch (not from dataplane)",
                          "dataplane.records imports learner.step (not from dataplane)"}


def test_every_room_and_every_name_it_may_import_exists() -> None:
    names = {name for name, _ in modules(ROOT, (*PACKAGES, "bench"))}

    def exists(dotted: str) -> bool:
        return any(name == dotted or name.startswith(dotted + ".") for name in names)

    for room, allowed in MAY_IMPORT.items():
        assert exists(room), f"room {room} names no module"
        for entry in allowed:
            assert entry in FRAMEWORKS or exists(entry), f"{room} may import {entry}: neither ours nor a framework"


def test_the_import_graph_of_our_packages_has_no_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50  # it really read the packages
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def bench_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """bench/'s import graph: its scripts put bench/ on sys.path and import their siblings by bare name
    (``import sim_wan``), which is ``bench.sim_wan`` here, so a cycle through either spelling shows."""
    ours = dict(modules(root, ("bench",)))

    def resolved(target: str) -> str | None:
        return target if target in ours else f"bench.{target}" if f"bench.{target}" in ours else None

    return {name: {r for t in imports_of(name, path) if (r := resolved(t)) and r != name}
            for name, path in ours.items()}


def test_the_import_graph_of_the_benches_has_no_cycle(tmp_path: Path) -> None:
    graph = bench_graph()
    assert len(graph) > 20  # it really read bench/
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench_x.py").write_text("def main():\n    import sim_x\n")
    (tmp_path / "bench" / "sim_x.py").write_text("from bench_x import main\n")
    assert find_cycle(bench_graph(tmp_path)) in (["bench.bench_x", "bench.sim_x", "bench.bench_x"],
                                                 ["bench.sim_x", "bench.bench_x", "bench.sim_x"])


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a.services": {"a.tasks"}, "a.tasks": {"a.scheduling"}, "a.scheduling": {"a.services"}, "a": {"a.tasks"}}
    assert find_cycle(graph) == ["a.scheduling", "a.services", "a.tasks", "a.scheduling"]
    assert find_cycle({"a": {"a.b"}, "a.b": set()}) is None


def test_modules_and_functions_stay_readable() -> None:
    too_long = []
    for name, path in modules():
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"module {name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"function {name}.{node.name}: {length} lines")
    assert too_long == [], f"over {MAX_MODULE_LINES} lines a module / {MAX_FUNCTION_LINES} a function"


@pytest.mark.parametrize(("imports", "banned"), [
    ("worker_agent.cli, worker_agent.session, worker_agent.engines.hf", SITE_ONLY | {"learner", "redis"}),
    ("learner.cli, learner.trainer", SITE_ONLY | {"worker_agent"}),
    ("echo2_cli.cli", SITE_ONLY | {"learner", "worker_agent", "redis", "torch", "transformers"}),
    ("dataplane.records, dataplane.messages, dataplane.jobs, dataplane.snapshot, dataplane.tasks",
     SITE_ONLY | {"learner", "worker_agent", "torch", "redis"}),
    ("simulator.fleet, simulator.scenarios, simulator.metrics",
     SITE_ONLY - {"marketplace"} | {"learner", "worker_agent", "torch", "redis"}),
])
def test_what_each_plane_pulls_in_when_imported(imports: str, banned: set[str]) -> None:
    """The agent installs and runs without the site or Redis; the learner without the agent or the site."""
    code = (f"import sys\nimport {imports}\n"
            f"print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(banned)!r}))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_the_simulator_pulls_in_only_the_pure_cores_it_may() -> None:
    code = ("import sys\nimport simulator.fleet, simulator.scenarios, simulator.metrics\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('dataplane', 'marketplace'))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    pulled = set(done.stdout.strip().split(","))
    assert {m for m in pulled if m.startswith("marketplace") and room_of(m) != "marketplace.core"} == {"marketplace"}
    assert (ROOT / "marketplace" / "__init__.py").read_text() == ""  # so importing the pure cores runs nothing else
    assert not any(room_of(m) == "dataplane.replay" for m in pulled)
