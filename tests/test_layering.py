"""The planes stay apart (docs/architecture.md, DESIGN.md): every import of every module, inside functions
too, is read from the source and checked against the layering rules; the import graph of our packages has
no cycle; modules and functions stay small enough to read. A second check imports the agent and the
learner for real and looks at what they pulled in."""

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

# package -> top-level names its modules may never import
FORBIDDEN: dict[str, set[str]] = {
    "dataplane": {"learner", "worker_agent", *SITE_ONLY, "torch", "transformers", "safetensors"},
    "learner": {"worker_agent", *SITE_ONLY},
    "worker_agent": {"learner", "redis", *SITE_ONLY},
    "marketplace": {"learner", "worker_agent", "frontend", "torch", "transformers"},
    "frontend": {"learner", "worker_agent", "torch", "transformers"},
    # the owner's CLI: the REST API over httpx (typer, rich) and dataplane's job files; nothing of the site
    "echo2_cli": {"learner", "worker_agent", "redis", *SITE_ONLY, "torch", "transformers", "safetensors"},
    # the fleet simulator runs the pure cores (below) and nothing of the site, the planes or Redis
    "simulator": {"learner", "worker_agent", "redis", "torch", "transformers", *(SITE_ONLY - {"marketplace"})},
}
# The only modules of the site and the planes the simulator may import: plain functions over plain data, no Django,
# no I/O (the chain strategies are shared with the site through dataplane, whose job spec reads their names; they
# register in dataplane.registry, the variation points' one registry).
SIMULATOR_MAY_IMPORT = ("marketplace.core.provisioning", "marketplace.core.activation", "marketplace.core.controller",
                        "marketplace.core.inputs", "marketplace.core.reliability", "dataplane.broadcast.chains",
                        "dataplane.broadcast.strategies", "dataplane.registry")
SIMULATOR_PACKAGES = ("marketplace", "marketplace.core", "dataplane", "dataplane.broadcast")  # empty __init__s
# The site's rooms: marketplace/ is split by kind, and each room keeps to its kind. Sub-package -> names
# (top-level packages, or modules of ours) its modules may never import.
SITE_ROOMS: dict[str, set[str]] = {
    # pure cores: plain functions over plain data, which the simulator runs as the site does
    "marketplace.core": {"django", "rest_framework", "drf_spectacular", "channels", "celery", "redis", "knox",
                         "marketplace.models", "marketplace.services", "marketplace.reads", "marketplace.api",
                         "marketplace.realtime", "marketplace.infra"},
    # the REST API and its HTTP plumbing: no websockets
    "marketplace.api": {"channels", "channels_redis", "marketplace.realtime"},
    # the agents' websocket: no REST views
    "marketplace.realtime": {"rest_framework", "drf_spectacular", "marketplace.api.views"},
    # what the site leans on (Redis, probes, metrics): neither the API's nor the websocket's
    "marketplace.infra": {"rest_framework", "drf_spectacular", "channels", "marketplace.api", "marketplace.realtime"},
}
# Agents never talk to Redis, and redis-py is a dependency of the replay buffer alone among the planes.
REDIS_ALLOWED = {"dataplane.replay"}
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 60


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> Iterator[tuple[str, Path]]:
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path


def imports_of(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, anywhere in its source (functions and ``if`` blocks too), absolute."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def violations(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    out = []
    for name, path in modules(root, packages):
        plane = name.split(".")[0]
        for target in sorted(imports_of(name, path)):
            top = target.split(".")[0]
            if top in FORBIDDEN.get(plane, set()):
                out.append(f"{name} imports {target}")
            elif (plane == "simulator" and top in ("marketplace", "dataplane") and target not in SIMULATOR_PACKAGES
                  and not target.startswith(SIMULATOR_MAY_IMPORT)):
                out.append(f"{name} imports {target} (only {', '.join(SIMULATOR_MAY_IMPORT)})")
            elif top == "redis" and plane in ("dataplane", "learner", "worker_agent") and name not in REDIS_ALLOWED:
                out.append(f"{name} imports {target} (only {', '.join(sorted(REDIS_ALLOWED))} may)")
            elif (room := _room(name)) and any(target == f or target.startswith(f + ".") for f in SITE_ROOMS[room]):
                out.append(f"{name} imports {target} (not from {room})")
    return out


def _room(name: str) -> str | None:
    return next((room for room in SITE_ROOMS if name == room or name.startswith(room + ".")), None)


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

    found = violations(tmp_path, ("learner",))

    assert "learner.sneaky imports worker_agent.relay" in found
    assert "learner.relative imports worker_agent.session" in found
    assert any(v.startswith("learner.cache imports redis") for v in found)


def test_a_planted_import_across_the_site_rooms_is_caught(tmp_path: Path) -> None:
    for room in ("", "core", "api", "infra"):
        (tmp_path / "marketplace" / room).mkdir(parents=True, exist_ok=True)
        (tmp_path / "marketplace" / room / "__init__.py").write_text("")
    (tmp_path / "marketplace" / "core" / "pricing.py").write_text("from django.db import models\n"
                                                                  "from ..models import Job\n")
    (tmp_path / "marketplace" / "infra" / "probe.py").write_text("def f():\n    from ..api import views\n")
    (tmp_path / "marketplace" / "api" / "push.py").write_text("from channels.layers import get_channel_layer\n")

    found = violations(tmp_path, ("marketplace",))

    assert "marketplace.core.pricing imports django.db (not from marketplace.core)" in found
    assert "marketplace.core.pricing imports marketplace.models (not from marketplace.core)" in found
    assert "marketplace.infra.probe imports marketplace.api.views (not from marketplace.infra)" in found
    assert "marketplace.api.push imports channels.layers (not from marketplace.api)" in found


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
    assert {m for m in pulled if m not in SIMULATOR_PACKAGES and not m.startswith(SIMULATOR_MAY_IMPORT)} == set()
