"""The fleet simulator against bench/bench_wan.py's runs (``bench_simulator.py --wan-json``): per row, T_bcast, the
bubble and the share of records dropped stale, real and simulated for the same links.

What the simulator takes from a run (never the quantities compared): the profile's links (rates, round trips: B0,
each worker's up- and downlink, the learner's, the site's), the job (S, kappa, R, n, M, the strategy), and what the
run measured of its parts: ``T_train`` and the learner's own time per step outside waiting and training (its step
reports' timing split, ``wall - wait - train``: checkpoints, reports), each worker's generation rate ``mu_i`` and cv
(lease-to-return times from Redis' append-only file) and the lease round trip (bench_simulator.py ``calibrate``),
the learner's prompt feeder's cycle (its top-ups in the same file: :func:`feeder_cycle`).
The broadcast is simulator/wan.py's: flows over the links, publications overlapping, the site's planner and
``Bw_hat``, the agents' one-fetch rule and install lock.

The real figures are over the same steps as the simulated ones: the steps after the first two (the first waits
for every agent to build its engine from the base, which the simulator starts with).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from pathlib import Path

from sim_calibration import WARMUP, calibrate, median_or_none, real_figures

from simulator import metrics
from simulator.fleet import simulate
from simulator.model import MBIT, Link, NetSpec, SimConfig, WanSpec
from simulator.wan import MeasuredWan

INSTALLED = re.compile(r"installed snapshot v(\d+) of job \d+ \(([\d.]+) ?s after publication")
FEEDER_QUANTILE = 0.1  # the fastest decile of the gaps between top-ups: the feeder's own cycle (feeder_cycle)
ONE_TOP_UP_MS = 10  # XADDs of one top-up land within this many ms of each other (one call, several prompts)
# How one run's installs after their last byte spread around its median (install_spread): measured on the two runs of
# bench/data/wan-sim-2026-12-05-check.json (29 installs), held out from the 12 rows of wan-sim-2026-12-05.json.
INSTALL_MEAN_PER_MEDIAN = 1.07
INSTALL_CV = 0.60
LEGACY_PART_BYTES = 256 * 1024  # the relays' parts until 313635f; rows from before carry no part_bytes


def run_record(row: dict) -> dict | None:
    """What the run measured of its processes, for :func:`step_timing` and :func:`process_latency`: the steps (each
    with its ``timing`` split and ``created_at``), the snapshots (``published_at``), bench/wan/timeline.py's
    versions and each agent's install of each version ({(version, node): seconds}). From the row's calibration where
    it carries them (bench/wan/run.py, rows since 2026-12-05: a row is enough alone), else from the run's
    results.json and the agents' logs beside it (older rows; None when that directory is gone)."""
    cal = row.get("calibration") or {}
    if "timeline" in cal and "installed" in cal:
        return {"metrics": cal["metrics"], "snapshots": cal["snapshots"], "timeline": cal["timeline"],
                "installed": {(i["version"], i["node"]): i["seconds"] for i in cal["installed"]}}
    logs = Path(row.get("logs") or "")
    path = logs.parent / "results.json"
    if not row.get("logs") or not path.exists():
        return None
    results = json.loads(path.read_text())
    installed = {}
    for log in logs.glob("agent-*.log"):
        for v, t in INSTALLED.findall(log.read_text(errors="replace")):
            installed[(int(v), log.stem.removeprefix("agent-"))] = float(t)
    return {"metrics": [{**m, "timing": (m.get("extra") or {}).get("timing")} for m in results["metrics"]],
            "snapshots": results["snapshots"], "timeline": results.get("timeline", []), "installed": installed}


def step_timing(row: dict) -> dict | None:
    """What the learner spends outside waiting and training (None when the run's record is gone, :func:`run_record`):
    per step (``overhead``: the step reports' ``wall - wait - train``), the extra of a publication step (``publish``),
    and ``publish_lag``, the median from a publishing step's report reaching the site to its publication reaching
    the site (the snapshot written in the background, then posted)."""
    if "step_timing" in row:  # kept with the row (bench/data/wan-sim-*.json)
        return row["step_timing"]
    record = run_record(row)
    if record is None:
        return None
    kappa = row["calibration"]["job"]["kappa"]
    rest = {m["step"]: m["timing"]["wall"] - m["wait_s"] - m["t_train"] for m in record["metrics"]
            if m["step"] > WARMUP and m.get("timing")}
    made = {m["step"]: _wall(m["created_at"]) for m in record["metrics"] if m.get("created_at")}
    lags = [_wall(s["published_at"]) - made[s["version"]] for s in record["snapshots"]
            if s["version"] >= 1 and s["version"] in made and s.get("published_at")]
    plain = [v for s, v in rest.items() if s % kappa]
    publishing = [v for s, v in rest.items() if not s % kappa]
    if not plain or not publishing:
        return None
    overhead = statistics.fmean(plain)
    return {"overhead": max(0.0, overhead), "publish": max(0.0, statistics.fmean(publishing) - overhead),
            "publish_lag": max(0.0, statistics.median(lags)) if lags else 0.0}


def part_bytes(row: dict) -> int:
    """The relays' part size in the run (``calibration.part_bytes``; rows recorded before it was, 256 KiB)."""
    return int((row.get("calibration") or row).get("part_bytes") or LEGACY_PART_BYTES)


def process_latency(row: dict) -> dict | None:
    """What the run's processes took around a transfer, measured (None when the run's record is gone,
    :func:`run_record`): ``install``, the median from a child's last byte (its parent's proxy's tap) to its agent's
    install (its log); ``report``, the
    median from the install that completed 1/gamma of a version's installs to the site counting it, less the report's
    one way on the links; ``relay_lag``, the median of a relayed hop's last byte after its parent's last byte beyond a
    part at the hop's goodput and the hop's one way (bench/wan/timeline.py's lag), over hops with no other transfer on
    their two links meanwhile (what the flows model already has)."""
    if "process_latency" in row:
        return row["process_latency"]
    record = run_record(row)
    if record is None:
        return None
    installed = record["installed"]
    cal = row["calibration"]
    timeline = record["timeline"]
    spans = [(p["published"] + h["first_s"], p["published"] + h["last_s"], h["parent"], h["child"])
             for p in timeline for h in p["hops"]]
    agent_rtt = statistics.median(x["rtt_ms"] for x in cal["links"].values()) / 1000
    install, report, lag = [], [], []
    for pub in timeline:
        last = {h["child"]: h["last_s"] for h in pub["hops"]}
        for h in pub["hops"]:
            t0, t1 = pub["published"] + h["first_s"], pub["published"] + h["last_s"]
            alone = not any(a < t1 and b > t0 and (c == h["child"] or q == h["parent"]) and (q, c) != (h["parent"],
                            h["child"]) for a, b, q, c in spans)  # no other transfer on the hop's two links
            if h["parent"] in last and alone and h.get("link_mbit_s"):
                rate = h["link_mbit_s"] * MBIT * 1448 / 1514
                lag.append(h["last_s"] - last[h["parent"]] - (part_bytes(row) / rate + agent_rtt))
        install += [installed[(pub["version"], h["child"])] - h["last_s"] for h in pub["hops"]
                    if (pub["version"], h["child"]) in installed]
        if pub["t_bcast_s"] is not None and pub["installs_s"]:
            q = math.ceil(len(pub["installs_s"]) / 1.1 - 1e-9)
            report.append(pub["t_bcast_s"] - sorted(pub["installs_s"])[q - 1])
    one_way = (statistics.median(x["rtt_ms"] for x in cal["links"].values()) + cal["site_rtt_ms"]) / 2000
    return {"install": max(0.0, statistics.median(install)) if install else 0.0,
            "report": max(0.0, statistics.median(report) - one_way) if report else 0.0,
            "relay_lag": max(0.0, statistics.median(lag)) if lag else 0.0}


def install_spread(rows: list[dict]) -> tuple[float, float]:
    """(mean over median, coefficient of variation) of the installs' seconds after their last byte (an agent's log
    against its parent's tap, as :func:`process_latency` measures them), each over its run's median, pooled over the
    rows that carry the full record (bench/wan/run.py ``calibration``: ``timeline`` and ``installed``): the shape
    ``INSTALL_MEAN_PER_MEDIAN`` and ``INSTALL_CV`` give every run around its own median."""
    pooled = []
    for row in rows:
        record = run_record(row)
        if record is None:
            continue
        seconds = [record["installed"][(p["version"], h["child"])] - h["last_s"] for p in record["timeline"]
                   for h in p["hops"] if (p["version"], h["child"]) in record["installed"]]
        middle = statistics.median(seconds) if seconds else 0.0
        pooled += [x / middle for x in seconds] if middle > 0 else []
    if len(pooled) < 2:
        raise ValueError("no row with its installs and hops recorded (calibration 'timeline' and 'installed')")
    mean = statistics.fmean(pooled)
    return mean, statistics.pstdev(pooled) / mean


def feeder_cycle(cal: dict) -> float | None:
    """Seconds of the learner's prompt feeder's own cycle, measured in the run's append-only file (``top_ups``: when
    its prompts landed in Redis): the fastest decile of the gaps between consecutive top-ups, the XADDs of one top-up
    (within ``ONE_TOP_UP_MS``) counted once. The feeder runs one top-up at a time, asked at each read of the stream
    (learner/prompts.py ``request_top_up``; asked while one runs, it is left to the next read), so while stale groups
    are read and dropped back to back its top-ups follow each other as fast as its cycle allows: a read, the
    acknowledgement, the two round trips of the top-up and the Python around them on the loaded learner (0.05-0.25 s
    measured where the protocol's round trips are 0.02-0.06 s). None: fewer than 5 such gaps."""
    stamps = cal.get("top_ups") or []
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:], strict=False) if b - a >= ONE_TOP_UP_MS)
    if len(gaps) < 5:
        return None
    return gaps[int(FEEDER_QUANTILE * (len(gaps) - 1))] / 1000


def _wall(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def wan_config(doc: dict, *, seed: int, flows: bool = True, timing: dict | None = None,
               processes: dict | None = None, steps_measured: bool = True,
               feeder_s: float | None = None) -> SimConfig:
    """The simulator for one row's ``calibration`` (the run's clean part in sim_real's shape): calibrated as for the
    loopback run (bench_simulator.py ``calibrate``), the learner's overhead from ``timing`` (:func:`step_timing`)
    where given, the prompt feeder's measured cycle ``feeder_s`` (:func:`feeder_cycle`) where given, and the run's
    links. With ``flows``, simulator/wan.py's broadcast; without, the closed-form install
    times of one broadcast alone after the announcement's latency (bench/wan/report.py ``announce_latency``)."""
    from bench.wan.report import announce_latency

    # Without the step reports' timing, the learner's overhead spread evenly over the steps: the publication split
    # (bench_simulator ``overhead``) reads a WAN run's broadcast waits as 1.5-3.3 s of publishing, where the reports
    # say 0.05-0.27 s.
    base = calibrate(doc, real_figures(doc), seed=seed, split=False)
    links = {int(w): link for w, link in doc["links"].items()}
    workers = [dataclasses.replace(w, bandwidth_bps=min(links[w.worker_id]["up_mbit"],
                                                        links[w.worker_id]["down_mbit"]) * MBIT)
               for w in base.workers]
    learner = base.learner
    if timing is not None:
        learner = dataclasses.replace(learner, overhead_s=timing["overhead"], publish_overhead_s=timing["publish"])
    if steps_measured:  # each step's own T_train, as the run measured it
        learner = dataclasses.replace(learner, t_train_steps=tuple(m["t_train"] for m in sorted(
            doc["metrics"], key=lambda m: m["step"])))
    # With the run's processes, each install drawn around its measured median as the runs' installs spread.
    spec, spread = (MeasuredWan, {"install_cv": INSTALL_CV}) if processes else (WanSpec, {})
    wan = spec(learner=Link(doc["b0_bps"], doc["b0_bps"], doc["learner_rtt_ms"] / 1000),
               site=Link(math.inf, math.inf, doc["site_rtt_ms"] / 1000),
               workers=tuple((w, Link(x["up_mbit"] * MBIT, x["down_mbit"] * MBIT, x["rtt_ms"] / 1000))
                             for w, x in sorted(links.items())),
               publish_s=(timing or {}).get("publish_lag", 0.0),
               install_s=(processes or {}).get("install", 0.0) * (INSTALL_MEAN_PER_MEDIAN if processes else 1.0),
               report_s=(processes or {}).get("report", 0.0), relay_lag_s=(processes or {}).get("relay_lag", 0.0),
               part_bytes=part_bytes(doc), **spread)
    latency = announce_latency(site_rtt_ms=doc["site_rtt_ms"], learner_rtt_ms=doc["learner_rtt_ms"],
                               agent_rtt_ms=statistics.median(x["rtt_ms"] for x in links.values()))
    net = NetSpec(b0_bps=doc["b0_bps"], chunk_bytes=doc["chunk_bytes"], strategy=doc["job"]["strategy"],
                  latency_s=0.0 if flows else latency, wan=wan if flows else None)
    agent_s, site_s, learner_s = (statistics.median(x["rtt_ms"] for x in links.values()) / 1000,
                                  doc["site_rtt_ms"] / 1000, doc["learner_rtt_ms"] / 1000)
    # The round trips of the job's data on these links (with flows): a lease is a request to the site and its answer;
    # a group returned crosses to the site, then to the learner's read of the stream; a top-up is the learner's
    # read of what is outstanding and its prompts landing at the site; each read of the stream and each
    # acknowledgement of dropped records is a round trip from the learner to Redis at the site.
    # The top-up: the feeder's measured cycle less the read that asks for it, where measured; else its round trips.
    read = site_s + learner_s
    top_up = 1.5 * read if feeder_s is None else max(1.5 * read, feeder_s - read)
    paths = {"lease_latency_s": agent_s + site_s, "return_latency_s": (agent_s + learner_s) / 2 + site_s,
             "top_up_latency_s": top_up, "read_rtt_s": read} if flows else {}
    return dataclasses.replace(base, workers=workers, net=net, **paths,
                               learner=dataclasses.replace(learner, snapshot_bytes=doc["job"]["snapshot_bytes"]))


def simulated(config: SimConfig, seeds: int, versions: list[int] | None = None, *, beyond: int = 10) -> dict:
    """T_bcast (median over ``versions``, the publications the real run's site timed, where the simulated site timed
    them too; None: every one it timed; the simulated job runs ``beyond`` steps longer so that a broadcast the real
    job's end did not cut short is not cut short here either), the bubble (mean of the real run's steps after
    WARMUP) and the share of returned records dropped stale, each the mean over ``seeds`` runs; with their spread."""
    runs = []
    for k in range(seeds):
        result = simulate(dataclasses.replace(config, seed=config.seed + k, steps=config.steps + beyond))
        result.steps = result.steps[:config.steps]
        returned = sum(n for _, _, n in result.delivered)
        timed = result.t_bcast if versions is None else {v: result.t_bcast[v] for v in versions
                                                          if v in result.t_bcast}
        runs.append({"t_bcast": median_or_none(timed.values()), "timed": len(timed),
                     "bubble": metrics.mean_step_bubble(result, WARMUP),
                     "stale": result.dropped / returned if returned else None})
    out = {}
    for key in runs[0]:
        got = [r[key] for r in runs if r[key] is not None]
        out[key] = statistics.fmean(got) if got else None
        out[f"{key}_range"] = (min(got), max(got)) if got else None
    return out


def wan_rows(rows: list[dict], seeds: int, *, feeder: bool = True) -> list[dict]:
    """Each bench_wan.py row (its ``--json``) beside the simulator for the same links: T_bcast (the site's median
    over the clean part's full publications), the bubble and the stale share (the steps after WARMUP, the real
    ones from the row's calibration); simulated twice: ``links`` (the links and the protocol only) and ``sim`` (also
    the run's measured process latencies around a transfer, :func:`process_latency`); and the closed-form T_bcast
    bench_wan.py printed (``closed_form_t_bcast``). ``feeder`` False: the top-up at its round trips, not the run's
    measured feeder cycle (:func:`feeder_cycle`; what the table was before it)."""
    out = []
    for row in rows:
        label = f"{row['profile']} {row['strategy']} N={row['agents']}"
        cal = row["calibration"]
        try:
            timed = [s["version"] for s in cal["snapshots"] if s["version"] >= 1 and s["t_bcast"] is not None]
            timing, processes = step_timing(row), process_latency(row)
            feeder_s = feeder_cycle(cal) if feeder else None
            links = simulated(wan_config(cal, seed=0, timing=timing, feeder_s=feeder_s), seeds, timed)
            sim = simulated(wan_config(cal, seed=0, timing=timing, processes=processes, feeder_s=feeder_s), seeds,
                            timed)
            real = real_figures(cal)
        except (TypeError, KeyError, ValueError, ZeroDivisionError, StopIteration, statistics.StatisticsError) as err:
            out.append({"row": label, "error": f"{type(err).__name__}: {err}"})
            continue
        accepted = row.get("accepted") or 0
        out.append({"row": label, "run": row.get("run"), "t_bcast": row.get("t_bcast_s"), "timed": timed,
                    "bubble": real["bubble"], "stale": row["dropped_stale"] / accepted if accepted else None,
                    "closed_form_t_bcast": row.get("sim_t_bcast_s"), "inputs": {"timing": timing,
                                                                                "processes": processes,
                                                                                "feeder_s": feeder_s},
                    **{f"sim_{k}": sim[k] for k in ("t_bcast", "bubble", "stale", "timed")},
                    **{f"links_{k}": links[k] for k in ("t_bcast", "bubble", "stale")},
                    "sim_ranges": {k: sim[f"{k}_range"] for k in ("t_bcast", "bubble", "stale")}})
    return out


def print_wan(rows: list[dict]) -> None:
    """One line per WAN row and quantity: real; simulated on the links alone, and with the run's process latencies,
    each with its error; whether the latter is within the 10 % target."""
    print(f"{'WAN run (bench_wan.py)':<30}{'quantity':<14}{'real':>8}{'links':>8}{'err %':>7}{'+proc.':>8}{'err %':>7}"
          "  target 10 %")
    for r in rows:
        if "error" in r:
            print(f"{r['row']:<30}cannot calibrate the simulator on this run: {r['error']}")
            continue
        for key, label in (("t_bcast", "T_bcast s"), ("bubble", "bubble"), ("stale", "dropped stale")):
            real, links, sim = r[key], r[f"links_{key}"], r[f"sim_{key}"]
            verdict = "-" if real is None or sim is None else "within" if abs(sim - real) <= 0.1 * real else "outside"
            name = f"{r['row']} {r['run']}" if r.get("run") else r["row"]
            print(f"{name:<30}{label:<14}{_f(real):>8}{_f(links):>8}{_err(real, links):>7}{_f(sim):>8}"
                  f"{_err(real, sim):>7}  {verdict}")


def _f(value: float | None) -> str:
    return "-" if value is None else format(value, ".3f")


def _err(real: float | None, sim: float | None) -> str:
    return "-" if real is None or sim is None or not real else f"{100 * (sim - real) / real:+.1f}"
