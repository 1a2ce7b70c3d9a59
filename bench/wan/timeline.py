"""Where a broadcast's time goes on the WAN bench: per version, when each hop of the chain got its first
and its last byte after the publication, beside the CPU the stack used meanwhile (:mod:`bench.wan.cpu`).

The hops are the proxies' bursts (:func:`bench.wan.report.hops`: bytes the child's TCP acknowledged without a pause,
sampled every 50 ms), each given to the newest full version published before it began. A hop's ``first_s`` is
its first acknowledged byte after the publication (the relay's handshake included: on a chain every hop opens at
once, so this is when its connection began, not when payload first flowed), ``last_s`` its last; ``depth`` its
place on its chain (1: the learner's seed). A pipelined hop ends a little after its parent's: ``lag_s`` (its last
byte after its parent's last) is what each hop adds to the chain, ideally one part's time at the link rate plus a
one-way delay; the seed's ``last_s - first_s`` is what the first link alone took (M / Bw at its rate), and
``over_seed`` the whole broadcast (first byte to last) over that: what the chain's relayed hops add, on the same
links and the same machine, whatever the links' goodput.
"""

from __future__ import annotations

import statistics

from . import cpu
from .report import wall


def depths(hops: list[dict], origin: str = "learner") -> dict[str, int]:
    """node -> its depth on the chain the hops form (the origin 0, its children 1...): a child's depth is its
    parent's plus one."""
    parent = {h["child"]: h["parent"] for h in hops}
    out = {origin: 0}

    def depth(node: str, seen: frozenset = frozenset()) -> int:
        if node not in out:
            up = parent.get(node)
            out[node] = 1 if up is None or up in seen else depth(up, seen | {node}) + 1
        return out[node]

    for node in parent:
        depth(node)
    return out


def versions(snapshots: list[dict], hops: list[dict], *, samples: list | None = None,
             installed: dict[int, list[float]] | None = None) -> list[dict]:
    """One record per full version after the base: its publication (wall time), the site's t_bcast, the agents'
    install latencies, each hop's first/last byte and rate, the fill (the deepest hop's first byte after the
    seeds'), and the CPU used from publication to the last hop's last byte (``samples``: a CpuSampler's)."""
    full = sorted((s for s in snapshots if s["version"] >= 1 and not s["manifest"].get("base_version")),
                  key=lambda s: wall(s["published_at"]))
    out = []
    for k, snap in enumerate(full):
        start = wall(snap["published_at"])
        end = wall(full[k + 1]["published_at"]) if k + 1 < len(full) else float("inf")
        mine = [h for h in hops if start <= h["t0"] < end]
        level = depths(mine)
        ends = {h["child"]: h["t1"] for h in mine}
        rows = sorted(({"parent": h["parent"], "child": h["child"], "depth": level.get(h["child"], 1),
                        "first_s": h["t0"] - start, "last_s": h["t1"] - start, "mb": h["mb"],
                        "mbit_s": h["mbit_s"], "link_mbit_s": h["link_mbit_s"],
                        "lag_s": h["t1"] - ends[h["parent"]] if h["parent"] in ends else None} for h in mine),
                      key=lambda r: (r["depth"], r["first_s"]))
        record = {"version": snap["version"], "published": start, "t_bcast_s": snap.get("t_bcast"),
                  "installs_s": sorted((installed or {}).get(snap["version"], [])), "hops": rows}
        if rows:
            seeds = [r["first_s"] for r in rows if r["depth"] == 1] or [min(r["first_s"] for r in rows)]
            deepest = max(r["depth"] for r in rows)
            lags = [r["lag_s"] for r in rows if r["lag_s"] is not None]
            record.update(first_byte_s=min(seeds), seed_s=statistics.median(r["last_s"] - r["first_s"] for r in rows
                                                                            if r["depth"] == 1),
                          lag_s=statistics.median(lags) if lags else None,
                          last_byte_s=max(r["last_s"] for r in rows), depth=deepest)
            record["over_seed"] = (record["last_byte_s"] - record["first_byte_s"]) / record["seed_s"] \
                if record["seed_s"] > 0 else None
            if samples:
                record["cpu"] = cpu.window(samples, start, start + record["last_byte_s"])
        out.append(record)
    return out


def summary(records: list[dict]) -> dict:
    """Medians over versions: first byte, the seeds' transfer, each relayed hop's lag, last byte, and the CPU during
    the broadcasts (cores
    used by the machine, by the stack and by each group; the machine's busy fraction)."""
    def med(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    timed = [r for r in records if r.get("hops")]
    loads = [r["cpu"] for r in timed if r.get("cpu")]
    out = {"versions": len(timed), "first_byte_s": med([r["first_byte_s"] for r in timed]),
           "seed_s": med([r["seed_s"] for r in timed]), "lag_s": med([r.get("lag_s") for r in timed]),
           "last_byte_s": med([r["last_byte_s"] for r in timed]), "over_seed": med([r.get("over_seed") for r in timed])}
    if loads:
        out.update(cpu_busy=med([c["busy"] for c in loads]), cpu_machine=med([c["machine"] for c in loads]),
                   cpu_stack=med([c["stack"] for c in loads]), cpu_cores=loads[0]["cores"],
                   cpu_groups={g: med([c["groups"].get(g, 0.0) for c in loads])
                               for g in sorted({g for c in loads for g in c["groups"]})})
    return out


def lines(records: list[dict]) -> list[str]:
    """The timeline as text: a line per version, then its hops (seconds after the publication)."""
    out = []
    for r in records:
        load = r.get("cpu") or {}
        groups = ", ".join(f"{g} {c:.2f}" for g, c in sorted(load.get("groups", {}).items()))
        out.append(f"v{r['version']}: t_bcast {_f(r['t_bcast_s'])} s, installs "
                   f"{', '.join(f'{t:.2f}' for t in r['installs_s']) or '-'}; first byte {_f(r.get('first_byte_s'))}"
                   f", seeds {_f(r.get('seed_s'))}, lag per hop {_f(r.get('lag_s'))}, last byte "
                   f"{_f(r.get('last_byte_s'))} s; cores: machine "
                   f"{_f(load.get('machine'), '.2f')} of {load.get('cores', '-')} ({groups or '-'})")
        for h in r["hops"]:
            out.append(f"  {h['parent']:>8} -> {h['child']:<4} depth {h['depth']}: {h['first_s']:6.2f} .. "
                       f"{h['last_s']:6.2f} s (lag {_f(h['lag_s'])}), {h['mb']:.1f} MB at {h['mbit_s']:.1f} of "
                       f"{h['link_mbit_s']:.0f} Mbit/s")
    return out


def _f(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)
