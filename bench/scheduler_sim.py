"""Simulate the slot scheduler on a large cluster: utilization and decision latency.

A cluster of 512 agents x 8 slots receives 10,000 trials of 1, 2, 4, 8, 16 or 32 slots
(equally likely) with log-normal lengths; like an ASHA search, a share of them is pruned
at 1/9 or 1/3 of its length and frees its slots early. Trials arrive as a Poisson stream
offering more work than the cluster holds, so a queue builds up. The same workload runs
twice through the real scheduler core (:class:`trials.scheduler.SlotScheduler`): with
backfilling (slotsweep's policy) and as plain FIFO without backfill (the baseline).

Printed for each: mean slot utilization while work is queued (time-weighted), the mean,
p50 and p99 latency of one placement decision (one ``schedule()`` call after the events
of an instant), and waiting times per trial size, which show that large trials are not
starved. The last line is machine-readable::

    utilization=<x> fifo_utilization=<y> ratio=<x/y> p50_ms=<a> p99_ms=<b>

Run: ``python bench/scheduler_sim.py`` (``--help`` for the knobs; ``--sweep`` takes about
4 minutes). Targets: utilization at least 0.95 and 1.15x FIFO's, p99 decision latency
under 2 ms.

Both runs place trials with best fit, so the ratio isolates backfilling. On 512 agents
that FIFO baseline is strong: a blocked head needs at most 4 whole agents, and among
512 some drain within minutes, so head-of-line blocking idles little capacity. The
report prints ``1 / fifo_utilization``: utilization cannot exceed 1, so no scheduler can
beat this baseline by more than that (about 1.01 on the default workload).
``--sweep`` runs 96 workload shapes (size mixes from equal to 32:8:4:2:1:1 towards
small trials, length spread, offered load, and experiments of up to 100 trials of one
size queued together) and prints the best ratio among those where backfilling keeps
utilization at 0.95 or more. Queuing trials by experiment is what hurts FIFO most, but
it also leaves free slots that no queued trial can use (only whole-agent trials wait),
which costs both policies alike.

``--experiments N`` simulates N searches sharing the pool instead (Determined's
cluster-wide scheduler): each experiment (driver) submits its own trials, all at its
start, with its own priority, size mix, lengths and fair-share weight, and every decision
is one ``schedule()`` over all their queued trials with ``group`` = experiment and
:meth:`~trials.scheduler.SlotScheduler.set_share` kept up to date (held = slots of its
running trials). 40,000 trials by default. Most experiments have priority 42 and weights
1 or 2, with trial counts spread log-evenly so that the largest has 500 times the trials
of the smallest (big sweeps of small pruned trials down to a few long, large, unpruned
ones); they start together (``--stagger-min`` spreads their starts). With N >= 4 one
experiment of priority 1 and large trials arrives after an hour, with N >= 6 one of
priority 10 after half an hour. Printed: utilization while work is queued; priority
inversions, i.e. placements made while a trial with a lower priority number waited that
would have fit on the free slots just before (this placement's included) outside the
agents reserved for the blocked head (must be 0), and separately
``backfill_exceptions``, where it would have fit only with those reserved agents (EASY
backfilling protects only the one blocked head: typically trials of the priority 1 and
10 experiments waiting behind a blocked head of theirs, while small priority-42 trials
fill agents outside its reservation); Jain's fairness index of slot-seconds / weight
among the equal-priority experiments over the time in which all of them have trials
queued (target 0.95 or more, with utilization 0.95 or more); and p50/p99 latency of the
decisions made with at least ``--latency-queue`` (10,000) trials queued (target p99
under 5 ms). The last line::

    utilization=<u> inversions=<n> backfill_exceptions=<m> jain=<j> p50_ms=<a> p99_ms=<b> queue=<q>

where ``queue`` is the fewest trials queued at a measured decision. Run:
``python bench/scheduler_sim.py --experiments 8`` (seconds). Scheduling never preempts,
so an experiment that starts after others have filled the pool with long trials reaches
its share only as they end: with ``--stagger-min`` the index drops accordingly.

``--shares`` mixes trials on shares of one slot (``slots_per_trial`` 1/8, 1/4, 1/2) with
whole-slot trials (1, 2, 4, 8 slots; trial-count weights ``--share-weights``; 40,000 trials
by default), arriving
as one Poisson stream whose work, shares counted at their fraction, is ``--load`` times
the cluster's capacity. The same workload runs twice through the scheduler core: with
shares packed onto shared slots (issue 52) and as today's whole-slot placement, where
each share trial takes a whole slot. A trial's length does not depend on its placement
(small trials leave most of a GPU idle: the digits example used 3% of an H200). Printed
for each: the slots claimed and the work done (shares at their fraction) over the
cluster's capacity while trials are queued, trials per hour, the waits per size, and the
decision latency; the last line::

    packed_work=<w> whole_work=<v> work_ratio=<w/v> wait_ratio=<whole/packed mean wait> throughput_ratio=<t> p99_ms=<b>

Run: ``python bench/scheduler_sim.py --shares`` (seconds). The makespan, and so trials per
hour, is bounded by the longest trial alike for both; the waits show the difference.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import itertools
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

from trials.scheduler import Agent, Placement, ResourcePool, SlotRequest, SlotScheduler

SIZES = (1, 2, 4, 8, 16, 32)
_FINISH, _ARRIVE = 0, 1  # at one instant, slots are freed before new trials are queued


@dataclass(frozen=True)
class SimTrial:
    trial_id: int
    slots: int
    arrival_s: float
    duration_s: float  # after pruning: what the trial really runs


@dataclass
class SimResult:
    utilization: float  # mean used/total slots while the queue is non-empty
    latencies_ms: list[float]
    makespan_s: float
    queued_s: float
    waits_s: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def make_pool(agents: int, slots: int) -> ResourcePool:
    return ResourcePool(
        name="default",
        agents=tuple(
            Agent(
                name=f"agent-{i:03d}", host=f"10.0.{i // 256}.{i % 256}", slots=tuple(range(slots))
            )
            for i in range(agents)
        ),
    )


def make_workload(
    n_trials: int,
    capacity_slots: int,
    *,
    load: float,
    mean_length_s: float,
    seed: int,
    experiment_size: int = 1,
    size_weights: tuple[float, ...] = (1.0,) * len(SIZES),
    sigma: float = 0.8,
) -> list[SimTrial]:
    """Trials with random sizes and lengths, arriving at ``load`` times the cluster's capacity.

    Sizes are drawn from :data:`SIZES` with ``size_weights`` (trial counts, not slots);
    full lengths are log-normal with shape ``sigma``. With ``experiment_size`` > 1 the
    trials come in experiments of about that many trials (half to one and a half times),
    all of one size and queued together, as when each experiment fixes its
    ``slots_per_trial``.
    """
    rng = random.Random(seed)
    mu = math.log(mean_length_s) - sigma**2 / 2  # so that the full lengths average mean_length_s
    batches: list[int] = []  # trials per submission
    sizes: list[int] = []
    while len(sizes) < n_trials:
        count = (
            1
            if experiment_size == 1
            else rng.randint(experiment_size // 2, experiment_size * 3 // 2)
        )
        count = min(count, n_trials - len(sizes))
        batches.append(count)
        sizes += rng.choices(SIZES, size_weights) * count
    durations = []
    for _ in range(n_trials):
        full = rng.lognormvariate(mu, sigma)
        rung = rng.random()
        # ASHA with reduction factor 3: most trials stop at the first or second rung.
        fraction = 1 / 9 if rung < 0.45 else (1 / 3 if rung < 0.75 else 1.0)
        durations.append(full * fraction)
    work = sum(s * d for s, d in zip(sizes, durations, strict=True))
    rate = len(batches) * load * capacity_slots / work  # submissions per second
    t = 0.0
    trials: list[SimTrial] = []
    for count in batches:
        for _ in range(count):
            i = len(trials)
            trials.append(SimTrial(i, sizes[i], t, durations[i]))
        t += rng.expovariate(rate)
    return trials


def simulate(pool: ResourcePool, trials: list[SimTrial], *, backfill: bool) -> SimResult:
    """Run the workload through the scheduler core, event by event."""
    scheduler = SlotScheduler(pool)
    total = pool.total_slots
    by_id = {trial.trial_id: trial for trial in trials}
    events: list[tuple[float, int, int]] = [(t.arrival_s, _ARRIVE, t.trial_id) for t in trials]
    heapq.heapify(events)
    running: dict[int, Placement] = {}
    result = SimResult(utilization=0.0, latencies_ms=[], makespan_s=0.0, queued_s=0.0)
    used = 0
    now = 0.0
    busy_area = 0.0
    gc.collect()  # start both runs from the same heap; the collector stays on
    while events:
        when = events[0][0]
        if scheduler.queued:
            result.queued_s += when - now
            busy_area += used * (when - now)
        now = when
        while events and events[0][0] == now:
            _, kind, trial_id = heapq.heappop(events)
            if kind == _FINISH:
                placement = running.pop(trial_id)
                scheduler.release(placement)
                used -= placement.slots
            else:
                trial = by_id[trial_id]
                scheduler.submit(SlotRequest(trial_id, trial.slots, order=trial_id))
        start = time.perf_counter_ns()
        placements = scheduler.schedule(backfill=backfill)
        result.latencies_ms.append((time.perf_counter_ns() - start) / 1e6)
        for placement in placements:
            trial = by_id[placement.request_id]  # type: ignore[index]
            running[trial.trial_id] = placement
            used += placement.slots
            result.waits_s[trial.slots].append(now - trial.arrival_s)
            heapq.heappush(events, (now + trial.duration_s, _FINISH, trial.trial_id))
    if scheduler.queued:
        raise RuntimeError(f"{scheduler.queued} trials never started")  # nothing waits forever
    result.makespan_s = now
    result.utilization = busy_area / (total * result.queued_s) if result.queued_s else 1.0
    return result


def _report(name: str, result: SimResult) -> None:
    lat = result.latencies_ms
    print(
        f"{name:>9}: utilization while queued {result.utilization:.4f} "
        f"(queue non-empty {result.queued_s / 3600:.1f} h of {result.makespan_s / 3600:.1f} h); "
        f"decisions {len(lat)}: mean {statistics.fmean(lat):.3f} ms, "
        f"p50 {result.percentile(0.50):.3f} ms, p99 {result.percentile(0.99):.3f} ms, "
        f"max {max(lat):.3f} ms"
    )
    waits = ", ".join(
        f"{size}: mean {statistics.fmean(w) / 60:.0f} / max {max(w) / 60:.0f}"
        for size, w in sorted(result.waits_s.items())
    )
    print(f"{'':>9}  wait in minutes by slots_per_trial: {waits}")


# -- several experiments sharing the pool (--experiments) ------------------------------


@dataclass(frozen=True)
class SimExperiment:
    """One search (driver): its trials all arrive at ``start_s``."""

    name: str
    priority: int
    weight: float
    start_s: float
    trials: tuple[SimTrial, ...]


@dataclass
class MultiResult:
    utilization: float  # mean used/total slots while any trial is queued
    inversions: int
    backfill_exceptions: int
    jain: float  # nan when the equal-priority experiments were never all backlogged
    fair_window_s: float  # time in which every equal-priority experiment had trials queued
    fair_slot_s: dict[str, float]  # slot-seconds of each of them within that time
    latencies_ms: list[float]  # decisions made with at least ``latency_queue`` trials queued
    min_queue: int  # fewest trials queued at a measured decision
    makespan_s: float
    waits_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _durations(
    rng: random.Random, count: int, mean_length_s: float, *, sigma: float, pruned: bool
) -> list[float]:
    """Log-normal full lengths; with ``pruned``, ASHA stops most trials at a low rung."""
    mu = math.log(mean_length_s) - sigma**2 / 2
    durations = []
    for _ in range(count):
        full = rng.lognormvariate(mu, sigma)
        rung = rng.random()
        fraction = 1 / 9 if rung < 0.45 else (1 / 3 if rung < 0.75 else 1.0)
        durations.append(full * fraction if pruned else full)
    return durations


# Size mixes (trial-count weights over SIZES) of the equal-priority experiments, from the
# one with the most trials (small trials) to the one with the fewest (large trials).
_MIXES_BY_RANK = (
    (4, 2, 1, 0, 0, 0),
    (2, 2, 2, 1, 0, 0),
    (0, 1, 2, 2, 1, 0),
    (0, 0, 1, 2, 2, 1),
    (0, 0, 0, 1, 2, 2),
    (0, 0, 0, 0, 1, 1),
)


def make_experiments(
    count: int,
    n_trials: int,
    *,
    mean_length_s: float,
    sigma: float,
    seed: int,
    stagger_s: float = 0.0,
) -> list[SimExperiment]:
    """``count`` experiments with about ``n_trials`` trials in all (see the module docstring).

    The equal-priority (42) experiments get trial counts spread log-evenly from the
    largest down to 1/500 of it. As in practice, big sweeps run many small, short, pruned
    trials and small experiments a few large, long ones (up to 4x the mean length,
    unpruned: final training runs), so that their demands in slot-hours are comparable
    and they compete for a long time. Weights alternate 1 and 2; they start together (a
    campaign launching its searches), or at random over the first ``stagger_s`` seconds.
    With ``count >= 4`` one experiment of priority 1 (1% of the trials, 16 and 32 slots)
    starts after an hour; with ``count >= 6`` one of priority 10 (2%, 8 and 16 slots)
    after half an hour.
    """
    if count < 2:
        raise ValueError("--experiments needs at least 2 experiments")
    rng = random.Random(seed)
    # (name, priority, weight, start_s, trials, size weights, mean length factor, pruned)
    specs: list[tuple[str, int, float, float, int, tuple[float, ...], float, bool]] = []
    urgent: list[tuple[str, int, float, float, tuple[float, ...]]] = []
    if count >= 4:
        urgent.append(("urgent", 1, 3600.0, 0.01, (0, 0, 0, 0, 1, 1)))
    if count >= 6:
        urgent.append(("high", 10, 1800.0, 0.02, (0, 0, 0, 1, 1, 0)))
    for name, priority, start, share, mix in urgent:
        specs.append((name, priority, 1.0, start, round(n_trials * share), mix, 1.0, True))
    normal = count - len(urgent)
    normal_trials = n_trials - sum(spec[4] for spec in specs)
    # Log-evenly from the largest to 1/500 of it, scaled to the trials left.
    raw = [500 ** (-i / (normal - 1)) for i in range(normal)]
    counts = [max(1, round(normal_trials * r / sum(raw))) for r in raw]
    for i, trials in enumerate(counts):
        rank = i / (normal - 1)  # 0: the most trials, 1: the fewest
        specs.append(
            (
                f"exp{i}",
                42,
                1.0 if i % 2 == 0 else 2.0,
                rng.uniform(0, stagger_s),
                trials,
                _MIXES_BY_RANK[round(rank * (len(_MIXES_BY_RANK) - 1))],
                1.0 + 3.0 * rank,
                rank < 0.5,
            )
        )
    experiments = []
    next_id = 0
    for name, priority, weight, start, trials, mix, length, pruned in specs:
        sizes = rng.choices(SIZES, mix, k=trials)
        durations = _durations(rng, trials, mean_length_s * length, sigma=sigma, pruned=pruned)
        made = tuple(
            SimTrial(next_id + j, size, start, duration)
            for j, (size, duration) in enumerate(zip(sizes, durations, strict=True))
        )
        next_id += trials
        experiments.append(SimExperiment(name, priority, weight, start, made))
    return experiments


def _fits(size: int, agent_size: int, outside: list[int]) -> bool:
    """Whether ``size`` slots fit, given how many agents have each number of free slots.

    Written apart from the scheduler's own fitting, on a pool of agents of one size: a
    request up to one agent needs one agent with enough free slots, a larger one whole
    free agents.
    """
    if size <= agent_size:
        return any(outside[n] > 0 for n in range(size, agent_size + 1))
    return outside[agent_size] >= size // agent_size


def simulate_experiments(
    pool: ResourcePool, experiments: list[SimExperiment], *, latency_queue: int
) -> MultiResult:
    """Run all experiments through one long-lived scheduler, event by event."""
    agent_size = pool.agents[0].size
    if any(agent.size != agent_size for agent in pool.agents):
        raise ValueError("the inversion check assumes agents of one size")
    scheduler = SlotScheduler(pool)
    index = {agent.name: i for i, agent in enumerate(pool.agents)}
    total = pool.total_slots
    owner: dict[int, int] = {}
    by_id: dict[int, SimTrial] = {}
    events: list[tuple[float, int, int]] = []
    for e, experiment in enumerate(experiments):
        scheduler.set_share(experiment.name, held=0, weight=experiment.weight)
        for trial in experiment.trials:
            owner[trial.trial_id] = e
            by_id[trial.trial_id] = trial
            events.append((trial.arrival_s, _ARRIVE, trial.trial_id))
    heapq.heapify(events)
    # Equal-priority experiments: those of the most common priority.
    priorities = [experiment.priority for experiment in experiments]
    common = max(set(priorities), key=lambda p: (priorities.count(p), p))
    equal = [e for e, p in enumerate(priorities) if p == common]
    held = [0] * len(experiments)
    queued = [0] * len(experiments)
    # Queued trials per priority and size, for the inversion check.
    waiting: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    # Agents by number of free slots (the scheduler's state, kept apart from it).
    free = [agent_size] * len(pool.agents)
    hist = [0] * (agent_size + 1)
    hist[agent_size] = len(pool.agents)
    running: dict[int, Placement] = {}
    fair_slot_s = [0.0] * len(experiments)
    result = MultiResult(0.0, 0, 0, math.nan, 0.0, {}, [], sys.maxsize, 0.0)
    used = 0
    now = 0.0
    busy_area = queued_s = 0.0
    gc.collect()
    while events:
        when = events[0][0]
        span = when - now
        if scheduler.queued:
            queued_s += span
            busy_area += used * span
        if all(queued[e] for e in equal):
            result.fair_window_s += span
            for e in equal:
                fair_slot_s[e] += held[e] * span
        now = when
        changed: set[int] = set()
        while events and events[0][0] == now:
            _, kind, trial_id = heapq.heappop(events)
            e = owner[trial_id]
            trial = by_id[trial_id]
            if kind == _FINISH:
                placement = running.pop(trial_id)
                scheduler.release(placement)
                for part in placement.agents:
                    i = index[part.agent.name]
                    hist[free[i]] -= 1
                    free[i] += len(part.slots)
                    hist[free[i]] += 1
                used -= trial.slots
                held[e] -= trial.slots
                changed.add(e)
            else:
                scheduler.submit(
                    SlotRequest(
                        trial_id,
                        trial.slots,
                        priority=experiments[e].priority,
                        order=trial_id,
                        group=experiments[e].name,
                    )
                )
                queued[e] += 1
                waiting[experiments[e].priority][trial.slots] += 1
        # What each driver would tell the scheduler before deciding.
        for e in changed:
            scheduler.set_share(experiments[e].name, held=held[e], weight=experiments[e].weight)
        before = scheduler.queued
        start = time.perf_counter_ns()
        placements = scheduler.schedule()
        elapsed_ms = (time.perf_counter_ns() - start) / 1e6
        if before >= latency_queue:
            result.latencies_ms.append(elapsed_ms)
            result.min_queue = min(result.min_queue, before)
        reserved = {index[name] for name in scheduler.reserved}
        for placement in placements:
            trial_id = placement.request_id  # type: ignore[assignment]
            trial = by_id[trial_id]
            e = owner[trial_id]
            priority = experiments[e].priority
            waiting[priority][trial.slots] -= 1
            # Could a waiting trial with a lower priority number have used these slots?
            outside = list(hist)
            for i in reserved:
                outside[free[i]] -= 1
            lower = [
                size
                for p, sizes in waiting.items()
                if p < priority
                for size, n in sizes.items()
                if n
            ]
            if any(_fits(size, agent_size, outside) for size in lower):
                result.inversions += 1
            elif any(_fits(size, agent_size, hist) for size in lower):
                result.backfill_exceptions += 1
            for part in placement.agents:
                i = index[part.agent.name]
                hist[free[i]] -= 1
                free[i] -= len(part.slots)
                hist[free[i]] += 1
            running[trial_id] = placement
            used += trial.slots
            held[e] += trial.slots
            queued[e] -= 1
            result.waits_s[experiments[e].name].append(now - trial.arrival_s)
            heapq.heappush(events, (now + trial.duration_s, _FINISH, trial_id))
    if scheduler.queued:
        raise RuntimeError(f"{scheduler.queued} trials never started")
    result.makespan_s = now
    result.utilization = busy_area / (total * queued_s) if queued_s else 1.0
    result.fair_slot_s = {experiments[e].name: fair_slot_s[e] for e in equal}
    if result.fair_window_s > 0:
        x = [fair_slot_s[e] / experiments[e].weight for e in equal]
        result.jain = sum(x) ** 2 / (len(x) * sum(v * v for v in x))
    if not result.latencies_ms:
        result.min_queue = 0
    return result


def _run_experiments(pool: ResourcePool, args: argparse.Namespace) -> int:
    experiments = make_experiments(
        args.experiments,
        args.trials if args.trials is not None else 40_000,
        mean_length_s=args.mean_length_min * 60,
        sigma=args.sigma,
        seed=args.seed,
        stagger_s=args.stagger_min * 60,
    )
    print(
        f"cluster: {len(pool.agents)} agents x {pool.agents[0].size} slots; "
        f"{len(experiments)} experiments, "
        f"{sum(len(x.trials) for x in experiments)} trials, seed {args.seed}"
    )
    started = time.perf_counter()
    result = simulate_experiments(pool, experiments, latency_queue=args.latency_queue)
    window = result.fair_window_s
    print(
        f"{'experiment':>10} prio weight trials  start  wait mean/max (min)  slot-h/weight in window"
    )
    for x in experiments:
        waits = result.waits_s[x.name]
        fair = result.fair_slot_s.get(x.name)
        share = "" if fair is None else f"{fair / 3600 / x.weight:10.1f}"
        print(
            f"{x.name:>10} {x.priority:4d} {x.weight:6.1f} {len(x.trials):6d} "
            f"{x.start_s / 60:5.0f}m {statistics.fmean(waits) / 60:8.0f} / "
            f"{max(waits) / 60:<8.0f}  {share}"
        )
    lat = result.latencies_ms or [math.nan]
    print(
        f"utilization while queued {result.utilization:.4f} over {result.makespan_s / 3600:.1f} h; "
        f"all equal-priority experiments backlogged {window / 3600:.2f} h; "
        f"decisions with >= {args.latency_queue} queued: {len(result.latencies_ms)}, "
        f"max {max(lat):.3f} ms; simulated in {time.perf_counter() - started:.0f} s"
    )
    p50 = result.percentile(0.50) if result.latencies_ms else math.nan
    p99 = result.percentile(0.99) if result.latencies_ms else math.nan
    print(
        f"utilization={result.utilization:.4f} inversions={result.inversions} "
        f"backfill_exceptions={result.backfill_exceptions} jain={result.jain:.4f} "
        f"p50_ms={p50:.3f} p99_ms={p99:.3f} queue={result.min_queue}"
    )
    return 0


# Workload shapes --sweep tries: trial-count weights of SIZES, length spread, offered
# load and experiment size (runs of one size queued together).
_SWEEP_WEIGHTS = ((1, 1, 1, 1, 1, 1), (4, 2, 1, 1, 1, 1), (8, 4, 2, 2, 1, 1), (32, 8, 4, 2, 1, 1))
_SWEEP_SIGMAS = (0.8, 1.5)
_SWEEP_LOADS = (1.1, 1.5, 3.0)
_SWEEP_EXPERIMENT_SIZES = (1, 10, 40, 100)


def _sweep(pool: ResourcePool, args: argparse.Namespace) -> int:
    """Run many workload shapes; report the best ratio among those where backfill >= 0.95."""
    print("weights            sigma load exp  backfill fifo   ratio  ceiling")
    best: tuple[float, str] | None = None
    shapes = itertools.product(
        _SWEEP_WEIGHTS, _SWEEP_SIGMAS, _SWEEP_LOADS, _SWEEP_EXPERIMENT_SIZES
    )
    for weights, sigma, load, experiment_size in shapes:
        trials = make_workload(
            args.trials,
            pool.total_slots,
            load=load,
            mean_length_s=args.mean_length_min * 60,
            seed=args.seed,
            experiment_size=experiment_size,
            size_weights=weights,
            sigma=sigma,
        )
        ours = simulate(pool, trials, backfill=True).utilization
        fifo = simulate(pool, trials, backfill=False).utilization
        shape = f"{weights!s:18s} {sigma:5.1f} {load:4.1f} {experiment_size:4d}"
        print(f"{shape}  {ours:.4f}   {fifo:.4f} {ours / fifo:.3f}  {1 / fifo:.3f}", flush=True)
        if ours >= 0.95 and (best is None or ours / fifo > best[0]):
            best = (ours / fifo, shape)
    if best is None:
        print("no workload shape reached utilization 0.95 with backfilling")
    else:
        print(
            f"best ratio with utilization >= 0.95: {best[0]:.3f} (weights sigma load exp: {best[1]})"
        )
    return 0


# -- shares of one slot packed, against whole slots (--shares) ---------------------------

SHARE_SIZES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


@dataclass(frozen=True)
class ShareTrial:
    trial_id: int
    size: float  # slots, a share below 1
    arrival_s: float
    duration_s: float

    @property
    def request_slots(self) -> int:
        return max(1, int(self.size))


@dataclass
class ShareResult:
    claimed: float  # mean claimed / total slots while the queue is non-empty
    work: float  # mean work (shares at their fraction) / total slots while queued
    makespan_s: float
    latencies_ms: list[float]
    waits_s: dict[float, list[float]] = field(default_factory=lambda: defaultdict(list))

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]

    @property
    def mean_wait_s(self) -> float:
        return statistics.fmean(w for waits in self.waits_s.values() for w in waits)


def make_share_workload(
    n_trials: int,
    capacity_slots: int,
    *,
    load: float,
    mean_length_s: float,
    seed: int,
    size_weights: tuple[float, ...],
    sigma: float = 0.8,
) -> list[ShareTrial]:
    """Trials of :data:`SHARE_SIZES` arriving at ``load`` times capacity (shares at their
    fraction), with ASHA-pruned log-normal lengths as :func:`make_workload`'s."""
    rng = random.Random(seed)
    sizes = rng.choices(SHARE_SIZES, size_weights, k=n_trials)
    durations = _durations(rng, n_trials, mean_length_s, sigma=sigma, pruned=True)
    rate = (
        n_trials
        * load
        * capacity_slots
        / sum(size * duration for size, duration in zip(sizes, durations, strict=True))
    )
    t = 0.0
    trials = []
    for i, (size, duration) in enumerate(zip(sizes, durations, strict=True)):
        trials.append(ShareTrial(i, size, t, duration))
        t += rng.expovariate(rate)
    return trials


def simulate_shares(pool: ResourcePool, trials: list[ShareTrial], *, packed: bool) -> ShareResult:
    """Run the workload through the core: shares as shares (``packed``) or on whole slots."""
    scheduler = SlotScheduler(pool)
    by_id = {trial.trial_id: trial for trial in trials}
    events: list[tuple[float, int, int]] = [(t.arrival_s, _ARRIVE, t.trial_id) for t in trials]
    heapq.heapify(events)
    running: dict[int, Placement] = {}
    result = ShareResult(0.0, 0.0, 0.0, [])
    claimed = work = 0.0
    claimed_area = work_area = queued_s = 0.0
    now = 0.0
    gc.collect()
    while events:
        when = events[0][0]
        if scheduler.queued:
            queued_s += when - now
            claimed_area += claimed * (when - now)
            work_area += work * (when - now)
        now = when
        while events and events[0][0] == now:
            _, kind, trial_id = heapq.heappop(events)
            trial = by_id[trial_id]
            if kind == _FINISH:
                placement = running.pop(trial_id)
                scheduler.release(placement)
                claimed -= placement.size
                work -= trial.size
            else:
                share = trial.size if packed and trial.size < 1 else 1.0
                scheduler.submit(
                    SlotRequest(trial_id, trial.request_slots, order=trial_id, share=share)
                )
        start = time.perf_counter_ns()
        placements = scheduler.schedule()
        result.latencies_ms.append((time.perf_counter_ns() - start) / 1e6)
        for placement in placements:
            trial = by_id[placement.request_id]  # type: ignore[index]
            running[trial.trial_id] = placement
            claimed += placement.size
            work += trial.size
            result.waits_s[trial.size].append(now - trial.arrival_s)
            heapq.heappush(events, (now + trial.duration_s, _FINISH, trial.trial_id))
    if scheduler.queued:
        raise RuntimeError(f"{scheduler.queued} trials never started")
    total = pool.total_slots
    result.makespan_s = now
    result.claimed = claimed_area / (total * queued_s) if queued_s else 1.0
    result.work = work_area / (total * queued_s) if queued_s else 1.0
    return result


def _run_shares(pool: ResourcePool, args: argparse.Namespace) -> int:
    trials = make_share_workload(
        args.trials if args.trials is not None else 40_000,
        pool.total_slots,
        load=args.load,
        mean_length_s=args.mean_length_min * 60,
        seed=args.seed,
        size_weights=tuple(args.share_weights),
        sigma=args.sigma,
    )
    sizes = "/".join(f"{size:g}" for size in SHARE_SIZES)
    print(
        f"cluster: {len(pool.agents)} agents x {pool.agents[0].size} slots; {len(trials)} "
        f"trials of {sizes} slots (weights {args.share_weights}), offered load {args.load}x "
        f"(shares at their fraction), seed {args.seed}"
    )
    packed = simulate_shares(pool, trials, packed=True)
    whole = simulate_shares(pool, trials, packed=False)
    for name, result in (("packed", packed), ("whole", whole)):
        per_hour = len(trials) / (result.makespan_s / 3600)
        print(
            f"{name:>7}: claimed {result.claimed:.4f}, work {result.work:.4f} of the slots "
            f"while queued; {per_hour:.0f} trials/h over {result.makespan_s / 3600:.1f} h; "
            f"decisions p50 {result.percentile(0.5):.3f} ms, p99 {result.percentile(0.99):.3f} ms"
        )
        waits = ", ".join(
            f"{size:g}: {statistics.fmean(w) / 60:.0f}"
            for size, w in sorted(result.waits_s.items())
        )
        print(f"{'':>7}  mean wait in minutes by slots_per_trial: {waits}")
    print(
        f"packed_work={packed.work:.4f} whole_work={whole.work:.4f} "
        f"work_ratio={packed.work / whole.work:.3f} "
        f"wait_ratio={whole.mean_wait_s / max(packed.mean_wait_s, 1e-9):.3f} "
        f"throughput_ratio={whole.makespan_s / packed.makespan_s:.3f} "
        f"p99_ms={packed.percentile(0.99):.3f}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=512)
    parser.add_argument("--slots-per-agent", type=int, default=8)
    parser.add_argument(
        "--trials",
        type=int,
        default=None,
        help="default 10,000; 40,000 with --experiments or --shares",
    )
    parser.add_argument("--load", type=float, default=1.25, help="offered work / capacity")
    parser.add_argument("--mean-length-min", type=float, default=60.0)
    parser.add_argument(
        "--sigma", type=float, default=0.8, help="log-normal shape of the full trial lengths"
    )
    parser.add_argument(
        "--size-weights",
        type=float,
        nargs=len(SIZES),
        default=[1.0] * len(SIZES),
        metavar="W",
        help=f"relative numbers of trials of {'/'.join(map(str, SIZES))} slots (default: equal)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--experiment-size",
        type=int,
        default=1,
        help="trials per experiment of one size, queued together (1: every trial on its own)",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="try many workload shapes (size mix, length spread, load, experiment size) "
        "and print the best ratio among those where backfilling reaches 0.95",
    )
    parser.add_argument(
        "--experiments",
        type=int,
        default=0,
        metavar="N",
        help="N experiments sharing the pool with priorities and fair-share weights "
        "(0: one stream of trials, with the FIFO comparison)",
    )
    parser.add_argument(
        "--latency-queue",
        type=int,
        default=10_000,
        help="with --experiments: decision latency counts decisions with this many queued",
    )
    parser.add_argument(
        "--stagger-min",
        type=float,
        default=0.0,
        help="with --experiments: equal-priority experiments start at random within this "
        "many minutes (default: together)",
    )
    parser.add_argument(
        "--shares",
        action="store_true",
        help="mix trials on shares of one slot with whole-slot trials; packed against "
        "today's whole-slot placement",
    )
    parser.add_argument(
        "--share-weights",
        type=float,
        nargs=len(SHARE_SIZES),
        default=[3.0, 3.0, 2.0, 2.0, 1.0, 1.0, 1.0],
        metavar="W",
        help=f"with --shares: relative numbers of trials of {'/'.join(f'{s:g}' for s in SHARE_SIZES)} slots",
    )
    args = parser.parse_args(argv)

    pool = make_pool(args.agents, args.slots_per_agent)
    if args.shares:
        return _run_shares(pool, args)
    if args.experiments:
        return _run_experiments(pool, args)
    if args.trials is None:
        args.trials = 10_000
    if args.sweep:
        return _sweep(pool, args)
    trials = make_workload(
        args.trials,
        pool.total_slots,
        load=args.load,
        mean_length_s=args.mean_length_min * 60,
        seed=args.seed,
        experiment_size=args.experiment_size,
        size_weights=tuple(args.size_weights),
        sigma=args.sigma,
    )
    print(
        f"cluster: {args.agents} agents x {args.slots_per_agent} slots; {args.trials} trials of "
        f"{'/'.join(map(str, SIZES))} slots (weights {args.size_weights}), lengths sigma "
        f"{args.sigma}, offered load {args.load}x, experiment size {args.experiment_size}, "
        f"seed {args.seed}"
    )
    backfill = simulate(pool, trials, backfill=True)
    fifo = simulate(pool, trials, backfill=False)
    _report("backfill", backfill)
    _report("fifo", fifo)
    ratio = backfill.utilization / fifo.utilization
    # Utilization cannot exceed 1, so no scheduler can beat this FIFO by more than this.
    print(
        f"ceiling for any scheduler's ratio over this FIFO: 1 / fifo = {1 / fifo.utilization:.3f}"
    )
    print(
        f"utilization={backfill.utilization:.4f} fifo_utilization={fifo.utilization:.4f} "
        f"ratio={ratio:.3f} p50_ms={backfill.percentile(0.50):.3f} "
        f"p99_ms={backfill.percentile(0.99):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
