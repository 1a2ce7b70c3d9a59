"""The live run's figures and the simulator calibrated on them, shared by bench/bench_simulator.py (loopback and
live rows) and bench/sim_wan.py (the WAN rows): the calibration is never on the quantities compared (see
bench_simulator.py's docstring for what each input is)."""

from __future__ import annotations

import statistics

from simulator.model import MBIT, ControlSpec, LearnerSpec, NetSpec, SimConfig, WorkerSpec

WARMUP = 2  # steps left out on both sides: the pool filling up, the agents loading the model
NO_WORK_RETRY_S = 0.2  # the site answers a lease request it cannot serve with NoWork(retry_after=0.2)


def worker_rates(groups: list[dict], group_size: int) -> tuple[dict[int, float], float, float]:
    """(mu_i of each worker while busy, cv of one group's generation time, lease round trip in s).

    A lease's groups are generated in one batch and returned one after another; busy time is lease to last
    return. The simulator draws a lease of ``k`` groups as the sum of ``k`` gamma draws, so the per-group cv
    is the leases' cv times ``sqrt(k)``."""
    by_worker: dict[int, dict[int, list[int]]] = {}
    for g in groups:
        by_worker.setdefault(g["worker"], {}).setdefault(g["leased_ms"], []).append(g["returned_ms"])
    rates, spans, sizes, gaps = {}, [], [], []
    for w, leases in by_worker.items():
        ordered = sorted(leases.items())
        busy = [max(returned) - leased for leased, returned in ordered]
        spans += busy
        sizes += [len(returned) for _, returned in ordered]
        gaps += [b[0] - max(a[1]) for a, b in zip(ordered, ordered[1:], strict=False)]
        rates[w] = group_size * sum(len(r) for r in leases.values()) / (sum(busy) / 1000)
    cv = statistics.pstdev(spans) / statistics.fmean(spans) * statistics.fmean(sizes) ** 0.5
    return rates, cv, max(0.0, sorted(gaps)[len(gaps) // 10] / 1000)  # leased ahead: the next lease came first


def step_period(samples: list[list], first: int, last: int) -> float:
    """Seconds per learner step between the polls that first saw steps ``first`` and ``last``."""
    t_first = next(t for t, _, step, _ in samples if step >= first)
    t_last = next(t for t, _, step, _ in samples if step >= last)
    steps_first = next(step for _, _, step, _ in samples if step >= first)
    steps_last = next(step for _, _, step, _ in samples if step >= last)
    return (t_last - t_first) / max(1, steps_last - steps_first)


def real_figures(doc: dict) -> dict:
    """What the live run measured: bubble, throughput, period, T_train, lag (steps after WARMUP)."""
    steps = [m for m in doc["metrics"] if m["step"] > WARMUP]
    last = max(m["step"] for m in steps)
    running = [s for s in doc["samples"] if s[1] == "running" and s[2] > WARMUP]
    t0, t1 = running[0], running[-1]
    return {"bubble": statistics.fmean(m["wait_s"] / (m["wait_s"] + m["t_train"]) for m in steps),
            "wait": statistics.fmean(m["wait_s"] for m in steps),
            "t_train": statistics.fmean(m["t_train"] for m in steps),
            "throughput": (t1[3] - t0[3]) / (t1[0] - t0[0]),
            "period": step_period(doc["samples"], WARMUP + 1, last),
            "max_lag": max(m["max_staleness"] for m in steps),
            "t_bcast": median_or_none(s["t_bcast"] for s in doc["snapshots"] if s["t_bcast"] is not None),
            "install": median_or_none(i["seconds"] for i in doc["installs"])}


def median_or_none(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def overhead(doc: dict, real: dict, *, split: bool) -> tuple[float, float]:
    """(seconds per step, extra seconds per publication step) the learner spends outside waiting and training.

    Their sum per publication period is what the step period leaves: ``kappa (period - wait - T_train)``.
    Uniform: all of it spread over every step. Split: the publication step's extra is the difference between
    the durations of publication and other steps (medians of the long and short gaps between the learner's
    prompt top-ups, which alternate at kappa = 2), less the difference of their mean waits."""
    per_step = max(0.0, real["period"] - real["wait"] - real["t_train"])
    if not split:
        return per_step, 0.0
    gaps = [b - a for a, b in zip(doc["top_ups"], doc["top_ups"][1:], strict=False)][WARMUP:]
    gaps = sorted(g / 1000 for g in gaps if g < 3000)
    short, long = statistics.median(gaps[: len(gaps) // 2]), statistics.median(gaps[len(gaps) // 2:])
    kappa = doc["job"]["kappa"]
    steps = [m for m in doc["metrics"] if m["step"] > WARMUP]
    wait_pub = statistics.fmean(m["wait_s"] for m in steps if m["step"] % kappa == 0)
    wait_other = statistics.fmean(m["wait_s"] for m in steps if m["step"] % kappa)
    publish = max(0.0, long - short - (wait_pub - wait_other))
    return max(0.0, per_step - publish / kappa), publish


def calibrate(doc: dict, real: dict, *, seed: int, split: bool = True) -> SimConfig:
    """The simulator configured from the live run's measurements (see the module docstring)."""
    job = doc["job"]
    rates, cv, lease_rtt = worker_rates(doc["groups"], job["group"])
    workers = [WorkerSpec(w, job["price_per_hour"], mu, bandwidth_bps=100 * MBIT) for w, mu in sorted(rates.items())]
    per_step, publish = overhead(doc, real, split=split)
    learner = LearnerSpec(t_train=real["t_train"], batch=job["batch"], group=job["group"], staleness=job["staleness"],
                          kappa=job["kappa"], snapshot_bytes=job["snapshot_bytes"] or 335_592, overhead_s=per_step,
                          publish_overhead_s=publish)
    net = NetSpec(b0_bps=100 * MBIT, chunk_bytes=1 << 20, latency_s=real["install"])
    control = ControlSpec(gamma=1.1, activation="fixed", fixed_ids=tuple(sorted(rates)), controller=False)
    return SimConfig(workers, learner, net, control, steps=len(doc["metrics"]), seed=seed, cv=cv,
                     lease_groups=2, lease_latency_s=lease_rtt, lease_retry_s=NO_WORK_RETRY_S, lease_batch=True,
                     warmup_steps=WARMUP)
