"""A WAN topology described in a small TOML file (bench/wan/profiles/): one link per node (learner, site, agents).

Each node hangs off a shared bridge (the "internet core") by a link of its own: ``up_mbit`` (node -> core) and
``down_mbit`` (core -> node) are shaped by tc tbf; ``rtt_ms``, ``jitter_ms`` and ``loss`` are added by tc netem where
the kernel has it, else by our delay proxy (bench/wan/proxy.py; bench/wan/netns.py ``choose_emulation``). A path
between two nodes crosses both links: its round trip is the sum of theirs.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

PROFILES = Path(__file__).resolve().parent / "profiles"
LINK_FIELDS = ("up_mbit", "down_mbit", "rtt_ms", "jitter_ms", "loss")


@dataclass(frozen=True)
class Link:
    """One node's link to the core. Rates in Mbit/s (the edge unit), times in ms, loss a fraction of segments."""

    up_mbit: float = 1000.0
    down_mbit: float = 1000.0
    rtt_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.up_mbit <= 0 or self.down_mbit <= 0:
            raise ValueError(f"link rates must be positive, got up {self.up_mbit} down {self.down_mbit}")
        if self.rtt_ms < 0 or self.jitter_ms < 0 or not 0 <= self.loss < 1:
            raise ValueError(f"bad link: rtt {self.rtt_ms} ms, jitter {self.jitter_ms} ms, loss {self.loss}")

    @property
    def up_bps(self) -> float:
        """Uplink in bytes per second (the code's unit)."""
        return self.up_mbit * 1e6 / 8


@dataclass(frozen=True)
class Topology:
    """The nodes and their links: ``learner``, ``site`` and ``agents`` (one link each, in order)."""

    name: str
    learner: Link
    site: Link
    agents: tuple[Link, ...]

    def nodes(self) -> list[tuple[str, Link]]:
        """(node name, link) in address order: learner, site, a0, a1, ..."""
        return [("learner", self.learner), ("site", self.site)] + [(f"a{i}", link)
                                                                     for i, link in enumerate(self.agents)]

    def with_agents(self, count: int) -> Topology:
        """The same links with ``count`` agents: the first ``count - 1`` as given, the last one the profile's last
        (so a profile's slow last worker stays in a smaller run)."""
        if count < 1:
            raise ValueError("at least one agent")
        agents = [self.agents[min(i, len(self.agents) - 2)] if len(self.agents) > 1 else self.agents[0]
                  for i in range(count - 1)] + [self.agents[-1]]
        return replace(self, agents=tuple(agents))


def with_added_delay(topology: Topology, ms: float) -> Topology:
    """The same topology with ``ms`` more round trip on every link: every path (two links) ``ms`` more one way."""
    if not ms:
        return topology
    def more(link: Link) -> Link:
        return replace(link, rtt_ms=link.rtt_ms + ms)

    return replace(topology, learner=more(topology.learner), site=more(topology.site),
                   agents=tuple(more(a) for a in topology.agents))


def chains(topology: Topology) -> int:
    """N_ch = floor(B0/Bw), the site's number of chains (Bw the usual worker link), at most one per agent."""
    bw = min(a.up_mbit for a in topology.agents[:-1] or topology.agents)
    return min(len(topology.agents), max(1, int(topology.learner.up_mbit // bw)))


def _link(table: dict, where: str) -> Link:
    unknown = set(table) - set(LINK_FIELDS) - {"count", "override", "index"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(LINK_FIELDS)})")
    return Link(**{k: float(v) for k, v in table.items() if k in LINK_FIELDS})


def parse(text: str, name: str = "custom") -> Topology:
    """A topology from TOML text: ``[learner]``, ``[site]``, ``[agents]`` (with ``count`` and optional
    ``[[agents.override]]`` tables naming an ``index``, negative from the end)."""
    data = tomllib.loads(text)
    agents_table = data.get("agents", {})
    base = _link(agents_table, "agents")
    agents = [base] * int(agents_table.get("count", 2))
    for override in agents_table.get("override", []):
        index = int(override["index"])
        agents[index] = replace(agents[index], **{k: float(v) for k, v in override.items() if k in LINK_FIELDS})
    return Topology(data.get("name", name), _link(data.get("learner", {}), "learner"),
                    _link(data.get("site", {}), "site"), tuple(agents))


def load(name_or_path: str) -> Topology:
    """A shipped profile by name (``paper``, ``harsh``) or a TOML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES / f"{name_or_path}.toml"
    if not path.exists():
        shipped = ", ".join(sorted(p.stem for p in PROFILES.glob("*.toml")))
        raise ValueError(f"no profile {name_or_path!r} (shipped: {shipped})")
    return parse(path.read_text(), path.stem)
