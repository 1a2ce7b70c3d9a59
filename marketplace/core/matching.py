"""Which workers meet a job's requirements, and why the others do not. Pure: plain data in, reasons out.

A worker's hardware is what its agent reported (``dataplane/hardware.py``): a claim, used for matching only. A
worker that never reported any (an older agent) is matched on price and reliability alone, unless the owner asked
for memory or an engine explicitly: then it is left out as ``hardware unknown``. A derived memory need (an
estimate) never excludes it, so older agents keep serving the jobs they served.

A job that names its owner's code (a reward function ``pkg.module:fn``, a verifiers environment) needs a worker
whose provider opted in to run it (``echo2-agent run --allow-user-code``, declared in the agent's hello): one that
declared it does not is left out as ``user code``. One whose agent never said (an older agent) is matched as
before; it refuses such a job itself if its provider did not opt in (docs/trust.md, "User code on workers").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

REASONS = ("user code", "memory", "engine", "price", "reliability", "hardware unknown")
"""Why a worker does not qualify, in the order a reason is given (the first that applies)."""


@dataclass(frozen=True)
class Needs:
    memory_gb: float | None = None  # on one GPU (RAM on a CPU-only worker); None: not matched on
    memory_given: bool = False  # the owner's figure, not an estimate
    engine: str = "any"  # any, hf or vllm
    max_price_per_hour: float | None = None
    min_reliability: float = 0.0
    user_code: tuple[str, ...] = ()  # the owner's code its task runs on a worker (TaskAdapter.user_code)

    @property
    def explicit_hardware(self) -> bool:
        return self.memory_given or self.engine != "any"


@dataclass(frozen=True)
class Offer:
    """One worker as matching sees it."""

    worker_id: int
    price_per_hour: float
    reliability: float
    memory_gb: float | None = None  # its largest GPU's memory, else its RAM; None: no hardware reported
    engines: tuple[str, ...] = ()
    allow_user_code: bool | None = None  # its provider's opt-in as its agent declared it; None: never declared


def unmet(offer: Offer, needs: Needs) -> str | None:
    """The first requirement ``offer`` fails (one of :data:`REASONS`), None when it meets them all."""
    if needs.user_code and offer.allow_user_code is False:
        return "user code"
    if offer.memory_gb is None and needs.explicit_hardware:
        return "hardware unknown"
    if offer.memory_gb is not None and needs.memory_gb is not None and offer.memory_gb < needs.memory_gb:
        return "memory"
    if offer.memory_gb is not None and not (offer.engines if needs.engine == "any" else needs.engine in offer.engines):
        return "engine"
    if needs.max_price_per_hour is not None and offer.price_per_hour > needs.max_price_per_hour:
        return "price"
    if offer.reliability < needs.min_reliability:
        return "reliability"
    return None


@dataclass(frozen=True)
class Matching:
    qualify: tuple[int, ...]  # worker ids, sorted
    total: int
    excluded: dict[str, int] = field(default_factory=dict)  # reason -> workers, in REASONS order
    reasons: dict[int, str] = field(default_factory=dict)  # worker id -> its reason

    def line(self) -> str:
        """``3 of 12 match (memory 8, price 1)``."""
        why = ", ".join(f"{reason} {count}" for reason, count in self.excluded.items())
        return f"{len(self.qualify)} of {self.total} match" + (f" ({why})" if why else "")

    def as_dict(self) -> dict:
        return {"qualify": len(self.qualify), "total": self.total, "excluded": dict(self.excluded),
                "line": self.line()}


def match(offers: Sequence[Offer], needs: Needs) -> Matching:
    """Every offer sorted into those that qualify and those that do not, with the count per reason."""
    reasons = {o.worker_id: why for o in offers if (why := unmet(o, needs)) is not None}
    counts = Counter(reasons.values())
    return Matching(tuple(sorted(o.worker_id for o in offers if o.worker_id not in reasons)), len(offers),
                    {reason: counts[reason] for reason in REASONS if counts[reason]}, reasons)


def remedy(offers: Sequence[Offer], needs: Needs, matching: Matching) -> str:
    """When no offer qualifies: the requirement that leaves out the most workers, what the best of them has, and what
    the owner can change (the job file's field) or that it waits, e.g. ``needs 80 GB of GPU memory; the largest
    worker has 24 GB: lower requirements.min_gpu_memory_gb or wait``. "" when some qualify or there are none."""
    if matching.qualify or not matching.excluded:
        return ""
    reason = max(matching.excluded, key=lambda r: (matching.excluded[r], -REASONS.index(r)))
    left_out = [o for o in offers if matching.reasons.get(o.worker_id) == reason]
    if reason == "memory":
        largest = max(o.memory_gb or 0.0 for o in left_out)
        field = ("lower requirements.min_gpu_memory_gb" if needs.memory_given
                 else "set requirements.min_gpu_memory_gb if the estimate is too high, or use a smaller model,")
        return f"needs {needs.memory_gb:g} GB of GPU memory; the largest worker has {largest:g} GB: {field} or wait"
    if reason == "price":
        cheapest = min(o.price_per_hour for o in left_out)
        return (f"pays at most {needs.max_price_per_hour:g} USD/h; the cheapest worker asks {cheapest:g}: raise "
                "requirements.max_price_per_hour or wait")
    if reason == "reliability":
        best = max(o.reliability for o in left_out)
        return (f"needs reliability {needs.min_reliability:g}; the most reliable worker has {best:.2f}: lower "
                "requirements.min_reliability or wait")
    if reason == "engine":
        return f'needs the {needs.engine} engine, which none has: set requirements.engine = "any" or wait'
    if reason == "hardware unknown":
        return ("asks for GPU memory or an engine, and these workers reported no hardware (older agents): drop "
                "requirements.min_gpu_memory_gb and requirements.engine, or wait for an upgraded agent")
    return (f"runs your code ({', '.join(needs.user_code)}), which these workers' providers do not allow: wait for "
            "one started with echo2-agent run --allow-user-code")

