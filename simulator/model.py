"""What the fleet simulator is told (workers, learner, network, controller, faults) and what it reports.

Units as everywhere in the project (DESIGN.md "Units"): throughput in trajectories/s, prices in USD/h,
bandwidth in bytes/s, times in seconds. Every knob the paper leaves unstated has a default here and a line
saying what it stands for; docs/simulator.md lists the choices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MBIT = 1e6 / 8
"""Bytes per second in one Mbit/s (the paper quotes bandwidth in Mbit/s)."""


@dataclass(frozen=True)
class WorkerSpec:
    """One rollout worker of the candidate pool."""

    worker_id: int
    price_per_hour: float
    throughput: float
    """Mean ``mu_i`` (trajectories/s, end to end): a group of ``n`` takes ``n / mu_i`` on average."""
    bandwidth_bps: float = 100 * MBIT
    """The worker's cap ``Bw`` (down and up: what it receives and what its relay forwards)."""
    availability: float = 1.0
    """``a_i``: the share of time the worker is there. Below 1 it leaves and comes back in random spells
    (exponential, absences of mean ``SimConfig.absence_s``), losing the group in hand and re-fetching the
    snapshot on return; provisioning counts it at ``a_i mu_i``."""


@dataclass(frozen=True)
class LearnerSpec:
    t_train: float
    """Seconds per optimisation step (``T_train``)."""
    batch: int
    """Trajectories per step ``R``."""
    group: int
    """Samples per prompt ``n``: workers lease and return whole groups."""
    staleness: int
    """The budget ``S``: a record of version ``v`` is trained at learner version ``v_t`` only if ``v >= v_t - S``."""
    kappa: int
    """Publication period: a snapshot every ``kappa`` steps."""
    snapshot_bytes: float
    """``M``: the size of one snapshot."""
    backlog_groups: int | None = None
    """Groups in flight (leased, generating, buffered, untrained) at most; None = ``2 R / n`` like
    learner/prompts.py's top-up, the backpressure that keeps fast workers from running ahead."""
    overhead_s: float = 0.0
    """Seconds per step outside both the wait and ``T_train`` (reporting, checkpointing, publishing): 0 in
    the paper's model; the live stack's tiny-model runs spend most of a step there."""
    publish_overhead_s: float = 0.0
    """Extra seconds of a publication step (writing the snapshot and the checkpoint), after its overhead."""
    price_per_hour: float = 0.0
    """The learner cluster's price, billed for the whole run (4 x A100 = 12.24 USD/h in the paper)."""
    t_train_steps: tuple[float, ...] = ()
    """Each step's own ``T_train`` (step 1 first; a real run's, measured), ``t_train`` past its end; empty: always
    ``t_train``. A step's bubble ``wait / (wait + T_train)`` is convex in ``T_train``: the mean ratio of steps of
    varying ``T_train`` is above the ratio at their mean."""

    def train_seconds(self, step: int) -> float:
        return self.t_train_steps[step - 1] if step <= len(self.t_train_steps) else self.t_train

    @property
    def groups_per_step(self) -> int:
        return -(-self.batch // self.group)

    @property
    def backlog(self) -> int:
        return self.backlog_groups if self.backlog_groups is not None else 2 * self.groups_per_step


@dataclass(frozen=True)
class Link:
    """One node's access link (bench/wan/profile.py's): its rates, bytes/s, and its round trip; a path's round trip
    is the sum of its two ends' (the WAN bench's proxy holds each direction back by half of each link's)."""

    up_bps: float
    down_bps: float
    rtt_s: float = 0.0


@dataclass(frozen=True)
class WanSpec:
    """Snapshots as TCP flows over access links, publications overlapping (simulator/wan.py, simulator/flows.py),
    in place of the closed-form install times of one broadcast alone. Every figure a property of the links or of
    the agent's and site's protocol, none fitted (docs/simulator.md "Validation on WAN links")."""

    learner: Link
    site: Link
    workers: tuple[tuple[int, Link], ...]
    """(worker id, its link) for every worker."""
    part_bytes: float = 64 * 1024
    """A relay forwards a part once it holds it (dataplane/broadcast/serving.py's cut-through); the relays' own
    ``framing.DEFAULT_PART_BYTES`` (256 KiB before the WAN runs; bench/sim_wan.py gives older rows theirs)."""
    window_bytes: float = 4 * 2**20
    """Bytes one connection keeps in flight (Linux's tcp_wmem maximum; the WAN bench's proxy's window): a flow's
    rate is at most window / path round trip."""
    goodput: float = 1448 / 1514
    """Payload per byte a rate shaper counts: a 1448-byte TCP segment (timestamps on) is a 1514-byte frame."""
    publish_s: float = 0.0
    """Seconds from the end of a publishing step until the learner's publication leaves it (the snapshot written in
    the background and posted to the site; one way to the site comes on top)."""
    install_s: float = 0.0
    """Seconds from a snapshot's last byte to its weights in the engine, once no batch is generating."""
    relay_lag_s: float = 0.0
    """Seconds a relay forwards later than one part (its process's CPU: each hop's last byte after its parent's,
    beyond a part at the hop's rate and the hop's one way); the child trails by that many seconds of its downlink."""
    report_s: float = 0.0
    """Seconds the site takes to count an install report, beyond its one way there."""
    one_fetch: bool = True
    """The agent's rule (worker_agent/session.py ``_offer``): a version it forwards to no child waits while another
    version is fetched, and a newer one replaces it."""
    site_bandwidth: bool = True
    """Plan every publication as the site does, with each relay's ``Bw_hat`` measured from its children's installs
    (``chains.measured_bandwidth``: snapshot bytes over the child's seconds after publication); False: the
    registered rates."""

    def link(self, worker_id: int) -> Link:
        return dict(self.workers)[worker_id]


@dataclass(frozen=True)
class NetSpec:
    b0_bps: float
    """The learner's uplink budget ``B0``."""
    chunk_bytes: float = 8 * 2**20
    """Chunk size ``c`` of the store-and-forward pipeline (ours: 8 MiB; the paper does not say)."""
    strategy: str = "chain"
    """``chain`` (ECHO-2's forwarding chains), ``star-limited`` (every worker pulls from the learner within
    ``B0``) or ``star-unlimited`` (no uplink cap: the lower bound)."""
    cloud_bps: float = 1000 * MBIT
    """Rate at which a replacement worker fetches the current snapshot from cloud storage (appendix D)."""
    latency_s: float = 0.0
    """Fixed delay from publication until transfers start (announcement, connection set-up)."""
    relay_stall_s: float = 30.0
    """A child gives a silent parent up after this long; then the chain is repaired (appendix D)."""
    q: float | None = None
    """Installed share that ends ``T_bcast``; None = ``1 / gamma`` (section 5.1)."""
    wan: WanSpec | None = None
    """Transfers as flows over these links, publications overlapping (simulator/wan.py); None: the closed forms."""


@dataclass(frozen=True)
class ControlSpec:
    gamma: float = 1.1
    activation: str = "greedy"
    """``greedy`` (rho = c/mu, the paper's rule), ``exact`` (min-cost MILP), ``random``, ``fastest``, or
    ``fixed`` (activate exactly ``fixed_ids``, no controller)."""
    fixed_ids: tuple[int, ...] = ()
    tick_s: float = 30.0
    """Heartbeat and controller period (ours)."""
    window_s: float = 120.0
    """Sliding window of the heartbeat statistics ``mu_i(t)``, ``a_i(t)`` (ours)."""
    hysteresis_s: float = 60.0
    """A deviation from the target must last this long before the controller acts (ours)."""
    release_margin: float = 0.25
    worker_timeout_s: float = 60.0
    """A worker silent this long is released (the site's ECHO2_WORKER_TIMEOUT_S; ours)."""
    t_bcast_estimate: float | None = None
    """``T_bcast`` the provisioning rule uses; None = the broadcast model's value for the chosen pool."""
    controller: bool = True
    """Run the hysteresis controller (off: the initial activation stays as it is)."""
    availability_seen: str = "long-run"
    """The ``a_i`` a standby worker is planned with: ``long-run``, its true share of time there (the spec's; what
    the simulator always did), or ``window``, what the site's heartbeat window sees of a worker that is there now:
    1 (ours: the site has no other availability figure)."""
    reliability: bool = False
    """Weigh ``a_i mu_i`` by the long-run reliability ``r_i`` of marketplace/core/reliability.py, from each worker's
    record: a week before the run at its availability, plus the absences of the run (ours)."""


@dataclass(frozen=True)
class Fault:
    at: float
    """Simulated time of the fault; with ``stage='broadcast'`` the first publication after it."""
    kind: str
    """``drop`` (the worker dies) or ``slow`` (``factor`` times its throughput, or its relay bandwidth)."""
    stage: str = "rollout"
    """``rollout``: a worker's generation; ``broadcast``: a chain's forwarder (a seed with a child)."""
    factor: float = 0.5
    worker_id: int | None = None
    """None: the simulator picks (a forwarder with a child, or the first active worker)."""


@dataclass(frozen=True)
class SimConfig:
    workers: Sequence[WorkerSpec]
    learner: LearnerSpec
    net: NetSpec
    control: ControlSpec = ControlSpec()
    steps: int = 40
    seed: int = 0
    cv: float = 0.3
    """Coefficient of variation of one group's generation time (gamma-distributed; 0 = deterministic)."""
    faults: tuple[Fault, ...] = ()
    generation: str = "continue"
    """``continue``: a worker keeps generating under its installed version while a newer one is on its way
    (what the agent does); ``pause``: it leases nothing from a publication until it installed that snapshot,
    the conservative execution of appendix B.1 under which Eq. (2)'s ``mu_min`` is the exact threshold."""
    lease_groups: int = 1
    """Groups a worker leases at once (the agent's ``groups_per_lease``); it generates them one by one."""
    lease_latency_s: float = 0.0
    """Round trip of one lease (request to the site, prompts back) before generation starts."""
    lease_retry_s: float = 0.0
    """0: a worker takes a prompt the moment one is free. Otherwise the agent's protocol: a lease request
    that finds no prompt is answered NoWork and retried after this many seconds (the site's 0.2 s)."""
    return_latency_s: float = 0.0
    """From a group's end on the worker until the learner can read it (the submit to the site, the stream to the
    learner: one way each on a WAN)."""
    top_up_latency_s: float = 0.0
    """From a slot freed (trained or dropped) until its new prompt can be leased (the learner's top-up through
    Redis at the site)."""
    read_rtt_s: float = 0.0
    """The learner's round trip to Redis: each read of the stream (at most the groups still missing) and each
    acknowledgement of dropped records costs one (0: the stream is read whole, at once)."""
    lease_batch: bool = False
    """The agent generates a lease's groups in one batch and returns them together at its end (its
    ``rollout_groups``), rather than one after another."""
    absence_s: float = 600.0
    """Mean length of one absence of a worker whose availability is below 1 (ours)."""
    warmup_steps: int = 2
    """Steps left out of the bubble and throughput (the pool filling up at the start)."""
    sample_s: float = 10.0
    """Period of the ``mu_pool(t)`` trace."""


@dataclass
class StepRecord:
    step: int
    start: float
    wait_s: float
    t_train: float
    lags: dict[int, int]
    """lag -> records trained at that lag."""


@dataclass
class SimResult:
    steps: list[StepRecord] = field(default_factory=list)
    t_bcast: dict[int, float] = field(default_factory=dict)
    """version -> seconds from publication until the installed share reached q."""
    t_all: dict[int, float] = field(default_factory=dict)
    """version -> seconds until every worker of the plan installed it (absent when one died first)."""
    installs: dict[int, dict[int, float]] = field(default_factory=dict)
    """version -> worker -> seconds from publication until the worker installed it."""
    delivered: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, version, records) of every group returned."""
    delivered_by: dict[int, int] = field(default_factory=dict)
    """worker -> records it returned."""
    dropped: int = 0
    trained_max_lag: int = 0
    worker_cost: float = 0.0
    learner_cost: float = 0.0
    end: float = 0.0
    active_trace: list[tuple[float, float, int]] = field(default_factory=list)
    """(time, mu_pool, active workers) every ``sample_s``; mu_pool counts workers generating under a
    version no older than the newest one they should hold by now (see fleet.FleetSim.useful_capacity)."""
    target: float = 0.0
    initial_ids: tuple[int, ...] = ()
    events: list[tuple[float, str]] = field(default_factory=list)
