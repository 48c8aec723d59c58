"""What ``slotsweep diagnose`` concludes from its probes: pure functions over numbers.

Each probe is a short run of the experiment's own trial with one thing changed
(:mod:`searcher.diagnose.probes` runs them). Its phase timings give, per window of batches,
the seconds of a batch: input (waiting for the loader and copying to the device),
``train_batch`` (forward, backward and, on the last batch of an aggregation group, the
gradient exchange) and the rest (schedulers, metric reduction). From the probes:

- communication share: the step time that disappears when gradients are exchanged
  only every :data:`NO_EXCHANGE_AGGREGATION` batches (``1 - t_no_exchange / t``);
- input share: the step time that disappears with synthetic batches already on the
  device (``1 - t_synthetic / t``);
- weak-scaling efficiency: samples per second on N slots over N times those on one
  slot at the same per-slot batch (and one agent against several where the
  configuration spans agents);
- compression gain: how many times faster the step is with fp16 gradient compression
  (measured only when the verdict is communication-bound and none is configured).

The verdict: input-bound or communication-bound when that share is at least
:data:`BOUND_SHARE` of the step (the larger of the two when both are), else scaling
well when the efficiency is at least :data:`GOOD_EFFICIENCY` (the lower of the
weak-scaling and the agents' efficiency; none measured: one slot), else
compute-bound. A share whose probe did not run (``--probes``) counts as none.
Every number comes with its spread over the windows.

Example:
    >>> judge(communication_share=0.45, input_share=0.05, efficiency=0.5)
    <Verdict.COMMUNICATION_BOUND: 'communication-bound'>
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# aggregation_frequency of the probe that (almost) never exchanges gradients.
NO_EXCHANGE_AGGREGATION = 1000
# A share of the step time at least this large is the bottleneck.
BOUND_SHARE = 0.2
# Weak-scaling efficiency from which the trial scales well.
GOOD_EFFICIENCY = 0.8
# The version of the --json document (and of the stored report).
REPORT_FORMAT = 1


class Verdict(str, enum.Enum):
    """Where the step time goes, in the words the report uses."""

    COMMUNICATION_BOUND = "communication-bound"
    INPUT_BOUND = "input-bound"
    COMPUTE_BOUND = "compute-bound"
    SCALING_WELL = "scaling well"


@dataclass(frozen=True)
class Spread:
    """The median of per-window values and their range.

    Example:
        >>> Spread.of([3.0, 1.0, 2.0])
        Spread(median=2.0, low=1.0, high=3.0)
    """

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("a spread of no values")
        return cls(statistics.median(values), min(values), max(values))

    def text(self, fmt: str = ".3g") -> str:
        """``median (low-high)``, as the table shows it."""
        return f"{self.median:{fmt}} ({self.low:{fmt}}-{self.high:{fmt}})"


@dataclass(frozen=True)
class Window:
    """One window of a probe: batches and seconds per phase group (totals, not means)."""

    batches: int
    input_s: float
    train_batch_s: float
    other_s: float

    @property
    def step_s(self) -> float:
        """Seconds per batch over the window."""
        return (self.input_s + self.train_batch_s + self.other_s) / self.batches


@dataclass(frozen=True)
class Probe:
    """One probe's measurements: its windows, the samples of one step, its system metrics."""

    name: str
    description: str
    slots: int
    samples_per_step: int
    windows: tuple[Window, ...]
    #: Means over the probe of the agent's sampled metrics (CPU, GPU utilisation, memory).
    system: Mapping[str, float] = field(default_factory=dict)

    @property
    def step_s(self) -> Spread:
        return Spread.of([w.step_s for w in self.windows])

    @property
    def samples_per_s(self) -> Spread:
        return Spread.of([self.samples_per_step / w.step_s for w in self.windows])

    def split(self) -> dict[str, float]:
        """Median seconds per batch of input, train_batch and the rest."""
        return {
            "input_s": statistics.median(w.input_s / w.batches for w in self.windows),
            "train_batch_s": statistics.median(w.train_batch_s / w.batches for w in self.windows),
            "other_s": statistics.median(w.other_s / w.batches for w in self.windows),
        }


@dataclass(frozen=True)
class Exchange:
    """What one optimizer step exchanges and the bucket sweep's step times (seconds)."""

    parameters: int
    gradient_bytes: int
    world_size: int
    configured_bucket_mb: float
    sweep: Mapping[float, Spread]

    @property
    def best_bucket_mb(self) -> float:
        return min(sorted(self.sweep), key=lambda size: self.sweep[size].median)

    @property
    def bandwidth_bytes_s(self) -> float:
        """All-reduce bandwidth at the best size: gradient bytes over the exchange's time."""
        return self.gradient_bytes / self.sweep[self.best_bucket_mb].median


@dataclass(frozen=True)
class Suggestion:
    """A setting to try, why, and the gain a probe measured for it (``None``: not measured)."""

    setting: str
    why: str
    gain: float | None = None


def share_removed(step: Spread, without: Spread) -> Spread:
    """The share of ``step`` that disappears in ``without``, clipped at 0 (median, range).

    The range pairs the fastest of one with the slowest of the other: it is wide when
    the windows vary.

    Example:
        >>> share_removed(Spread(1.0, 0.9, 1.1), Spread(0.6, 0.5, 0.7)).median
        0.4
    """

    def share(base: float, other: float) -> float:
        return max(0.0, 1.0 - other / base) if base > 0 else 0.0

    return Spread(
        share(step.median, without.median),
        share(step.low, without.high),
        share(step.high, without.low),
    )


def efficiency(many: Spread, slots: int, one: Spread, one_slots: int = 1) -> Spread:
    """Weak-scaling efficiency: samples/s on ``slots`` over ``slots / one_slots`` times
    those on ``one_slots``.

    Example:
        >>> efficiency(Spread(180.0, 170.0, 190.0), 2, Spread(100.0, 95.0, 105.0)).median
        0.9
    """
    factor = slots / one_slots

    def ratio(a: float, b: float) -> float:
        return a / (factor * b) if b > 0 else 0.0

    return Spread(
        ratio(many.median, one.median), ratio(many.low, one.high), ratio(many.high, one.low)
    )


def judge(*, communication_share: float, input_share: float, efficiency: float | None) -> Verdict:
    """The verdict from the median shares and efficiency (``None``: one slot only).

    Example:
        >>> judge(communication_share=0.05, input_share=0.3, efficiency=0.9).value
        'input-bound'
        >>> judge(communication_share=0.05, input_share=0.05, efficiency=None).value
        'scaling well'
    """
    if max(input_share, communication_share) >= BOUND_SHARE:
        if input_share >= communication_share:
            return Verdict.INPUT_BOUND
        return Verdict.COMMUNICATION_BOUND
    if efficiency is None or efficiency >= GOOD_EFFICIENCY:
        return Verdict.SCALING_WELL
    return Verdict.COMPUTE_BOUND


def speedup(base: Spread, better: Spread) -> float:
    """How many times faster ``better``'s median step is than ``base``'s.

    Example:
        >>> speedup(Spread(2.0, 2.0, 2.0), Spread(1.0, 1.0, 1.0))
        2.0
    """
    return base.median / better.median if better.median > 0 else 1.0


def suggest(
    verdict: Verdict,
    *,
    configured: Probe,
    no_exchange: Probe | None,
    synthetic: Probe | None,
    exchange: Exchange | None,
    aggregation_frequency: int,
    compression: str,
    compressed: Probe | None = None,
) -> list[Suggestion]:
    """The settings to try for ``verdict``, each with the gain its probe measured
    (``compressed``: the probe with fp16 gradient compression, when it ran)."""
    tips: list[Suggestion] = []
    if verdict is Verdict.INPUT_BOUND and synthetic is not None:
        gain = speedup(configured.step_s, synthetic.step_s)
        tips.append(
            Suggestion(
                "more loader workers (DataLoader num_workers) and pin_memory=True",
                "the step waits for its batch; synthetic batches on the device ran faster",
                gain,
            )
        )
    if verdict is Verdict.COMMUNICATION_BOUND and no_exchange is not None:
        gain = speedup(configured.step_s, no_exchange.step_s)
        tips.append(
            Suggestion(
                f"optimizations.aggregation_frequency: {max(2, aggregation_frequency * 4)}",
                "fewer gradient exchanges per batch; the gain is the bound measured with "
                f"aggregation_frequency {NO_EXCHANGE_AGGREGATION}",
                gain,
            )
        )
        if compression == "none":
            tips.append(_compression_tip(configured, compressed))
        tips.append(
            Suggestion(
                "a larger global_batch_size, with lr_scaling: linear and warmup_epochs",
                "more compute per exchange; scale the learning rate with the batch and warm "
                "it up so the large batch trains as well",
            )
        )
    if verdict is Verdict.COMPUTE_BOUND:
        tips.append(
            Suggestion(
                "optimizations.mixed_precision: bf16 (or fp16)",
                "the step is spent computing; lower precision computes faster on GPUs",
            )
        )
    if exchange is not None and exchange.best_bucket_mb != exchange.configured_bucket_mb:
        configured_size = exchange.sweep.get(exchange.configured_bucket_mb)
        best = exchange.sweep[exchange.best_bucket_mb]
        tips.append(
            Suggestion(
                f"optimizations.tensor_fusion_threshold: {exchange.best_bucket_mb:g} "
                "(or auto_tune_tensor_fusion: true)",
                "the fastest bucket size of the sweep; the gain is on the gradient exchange",
                None if configured_size is None else speedup(configured_size, best),
            )
        )
    return tips


def _compression_tip(configured: Probe, compressed: Probe | None) -> Suggestion:
    """fp16 compression, with the step's gain when the compression probe ran."""
    why = "halves the gradient bytes on the wire (powersgd sends far fewer)"
    if compressed is None:
        return Suggestion("optimizations.gradient_compression: fp16", why)
    gain = speedup(configured.step_s, compressed.step_s)
    measured = (
        "the gain is the step with fp16 gradients"
        if gain > 1.0
        else "yet the step with fp16 gradients was no faster here: casting and the hook "
        "cost more than the bytes saved"
    )
    return Suggestion("optimizations.gradient_compression: fp16", f"{why}; {measured}", gain)


@dataclass(frozen=True)
class Report:
    """Everything ``slotsweep diagnose`` prints; ``as_json`` is its ``--json`` document."""

    name: str
    slots: int
    probes: tuple[Probe, ...]
    communication_share: Spread | None
    input_share: Spread | None
    scaling_efficiency: Spread | None
    agent_efficiency: Spread | None
    exchange: Exchange | None
    verdict: Verdict
    suggestions: tuple[Suggestion, ...]

    def probe(self, name: str) -> Probe | None:
        return next((p for p in self.probes if p.name == name), None)

    def as_json(self) -> dict[str, Any]:
        """Plain JSON values: probes with their windows, shares, the sweep, the advice."""

        def spread(value: Spread | None) -> dict[str, float] | None:
            return None if value is None else asdict(value)

        exchange = self.exchange
        return {
            "format": REPORT_FORMAT,
            "name": self.name,
            "slots": self.slots,
            "verdict": self.verdict.value,
            "probes": [
                {
                    "name": p.name,
                    "description": p.description,
                    "slots": p.slots,
                    "samples_per_step": p.samples_per_step,
                    "samples_per_s": asdict(p.samples_per_s),
                    "step_s": asdict(p.step_s),
                    "split_s": p.split(),
                    "system": dict(p.system),
                    "windows": [asdict(w) for w in p.windows],
                }
                for p in self.probes
            ],
            "communication_share": spread(self.communication_share),
            "input_share": spread(self.input_share),
            "scaling_efficiency": spread(self.scaling_efficiency),
            "agent_efficiency": spread(self.agent_efficiency),
            "exchange": None
            if exchange is None
            else {
                "parameters": exchange.parameters,
                "gradient_bytes": exchange.gradient_bytes,
                "world_size": exchange.world_size,
                "configured_bucket_mb": exchange.configured_bucket_mb,
                "best_bucket_mb": exchange.best_bucket_mb,
                "allreduce_bytes_per_s": exchange.bandwidth_bytes_s,
                "sweep_step_s": {f"{k:g}": asdict(v) for k, v in exchange.sweep.items()},
            },
            "suggestions": [asdict(s) for s in self.suggestions],
            "step_split_s": step_split(self),
        }


def step_split(report: Report) -> dict[str, float]:
    """Seconds of one configured step as compute, communication and input (the UI's chart).

    Communication is the configured ``train_batch`` time the no-exchange probe did not
    need; compute is the rest of ``train_batch`` plus the loop's other phases.
    """
    configured = report.probe("configured")
    assert configured is not None
    split = configured.split()
    share = report.communication_share.median if report.communication_share else 0.0
    communication = min(split["train_batch_s"], share * configured.step_s.median)
    return {
        "compute": split["train_batch_s"] - communication + split["other_s"],
        "communication": communication,
        "input": split["input_s"],
    }
