"""What a run is about to spend: GPU count x expected hours x price, with the spot model.

Every submission is estimated before it is sent, and the estimate travels in the job's tags and the front
door's ledger. The formula has one home, `core.spot.spot_estimate` (`retrain plan spot` uses it too);
this module only chooses its inputs from the request and the settings:

- GPUs: the train step's processes per node x nodes.
- Tier: the train compute (the request's, else pipeline.yml's) is low priority when its
  components/compute/*.yml says `tier: low_priority`, or when RETRAIN_LOW_PRIORITY_COMPUTES names it.
  Dedicated compute is never evicted and pays the full price.
- Evictions: a multi-node job stops when any one of its nodes is evicted, so a run of H hours on N
  low-priority nodes expects H x N / (mean hours between evictions of one node) of them. The mean is the
  run's own `mtbe_hours` parameter when it sets one, else the setting.
- Expected train hours: the setting (RETRAIN_EXPECTED_TRAIN_HOURS), unless the caller measured the model:
  `retrain run` passes what the model's last training on this machine took (`MeasuredTraining`, read by
  components/local/measured.py), scaled to this run's epochs and GPU count. The estimate says which
  (`basis`).
- Checkpoint interval: the run's own `checkpoint_every_seconds` parameter when it is a number of seconds
  ('off': no checkpoints, so an eviction loses half the run), else the setting (for 'auto', the trainer's
  default, which picks Daly's interval once it has measured a save).

The RETRAIN_* cost variables are read here and nowhere else (`CostSettings.from_environ`): the Function
App's settings delegate to it, and so do `retrain submit` and `retrain run`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from components.errors import PipelineError, SpecError
from components.request import RunRequest
from components.specs import COMPUTE_FILES, PIPELINE_FILE, load_pipeline_spec, load_yaml
from core.spot import SECONDS_PER_HOUR, SpotScenario, is_finite_number, spot_estimate

GPU_HOUR_PRICE = "RETRAIN_GPU_HOUR_PRICE"
SPOT_DISCOUNT = "RETRAIN_SPOT_DISCOUNT"
EXPECTED_TRAIN_HOURS = "RETRAIN_EXPECTED_TRAIN_HOURS"
MTBE_HOURS = "RETRAIN_MTBE_HOURS"
CHECKPOINT_EVERY_HOURS = "RETRAIN_CHECKPOINT_EVERY_HOURS"
RESTART_OVERHEAD_HOURS = "RETRAIN_RESTART_OVERHEAD_HOURS"
LOW_PRIORITY_COMPUTES = "RETRAIN_LOW_PRIORITY_COMPUTES"
COST_VARIABLES = (
    GPU_HOUR_PRICE,
    SPOT_DISCOUNT,
    EXPECTED_TRAIN_HOURS,
    MTBE_HOURS,
    CHECKPOINT_EVERY_HOURS,
    RESTART_OVERHEAD_HOURS,
    LOW_PRIORITY_COMPUTES,
)

# Azure prices low-priority capacity roughly 60-80 % below dedicated; the cautious end makes an unmeasured
# estimate err towards spending more, never less.
DEFAULT_SPOT_DISCOUNT = 0.6
# A placeholder until measured: the train step's uninterrupted hours at the GPU count it is given.
DEFAULT_EXPECTED_TRAIN_HOURS = 1.0
# Azure publishes no eviction rate for low-priority clusters: one eviction per node every 12 hours is a
# cautious guess (`retrain plan interval --mtbe-hours` takes the same figure once you have measured yours).
DEFAULT_MTBE_HOURS = 12.0
# A restart waits for a node, pulls the image and loads the checkpoint: about six minutes.
DEFAULT_RESTART_OVERHEAD_HOURS = 0.1
# What the trainer's 'auto' interval (Daly's, `retrain plan interval`) comes to for a save of about 10 s
# and 12 hours between evictions: sqrt(2 x 10 s x 43,200 s), about 15 minutes.
DEFAULT_CHECKPOINT_EVERY_HOURS = 0.25

TRAIN_STEP = "train"
CHECKPOINT_PARAMETER, NO_CHECKPOINTS = "checkpoint_every_seconds", "off"
MTBE_PARAMETER = "mtbe_hours"
EPOCHS_PARAMETER = "epochs"
LOW_PRIORITY, DEDICATED = "low_priority", "dedicated"
# Tags are strings: hours and money to the cent, the ratio to a tenth of a percent.
COST_TAG, GPU_HOURS_TAG, WALL_HOURS_TAG = (
    "retrain.estimated_cost",
    "retrain.estimated_gpu_hours",
    "retrain.estimated_wall_hours",
)
RATIO_TAG, GPUS_TAG, TIER_TAG = "retrain.cost_vs_dedicated", "retrain.estimated_gpus", "retrain.train_tier"

_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_COMPUTE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{1,31}")
_AZUREML = "azureml:"
_EXPECTED_COMPUTES = (
    "comma-separated compute names (a letter, then 2-32 letters, digits or '-'), e.g. gpu-spot"
)


class CostSettingsError(PipelineError):
    """A cost setting is malformed; the message names the variable and the expected form."""


@dataclass(frozen=True)
class ComputeDefaults:
    """What the YAMLs say about where training runs: the train step's compute in pipeline.yml, and which
    of the computes in components/compute/ are low priority."""

    train_compute: str
    low_priority_computes: frozenset[str]


@functools.cache
def compute_defaults(
    pipeline_file: Path = PIPELINE_FILE, compute_files: tuple[Path, ...] = tuple(COMPUTE_FILES.values())
) -> ComputeDefaults:
    """Read once per process: the YAMLs are part of the deployed code and do not change under it."""
    spec = load_pipeline_spec(pipeline_file)
    train = spec.steps.get(TRAIN_STEP)
    compute = (train.compute if train else None) or spec.default_compute
    if compute is None:
        raise SpecError(f"{spec.path}: expected a '{TRAIN_STEP}' step with a compute to estimate runs on")
    documents = [load_yaml(path) for path in compute_files]
    names = {str(document.get("name")) for document in documents if document.get("tier") == LOW_PRIORITY}
    return ComputeDefaults(_plain(compute), frozenset(_plain(name) for name in names))


def _plain(compute: str) -> str:
    return compute.removeprefix(_AZUREML)


def _positive_number(value: Any) -> float | None:
    """`value` as a finite number > 0 (a number, or text such as '600'); None when it is not one."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if value > 0 else None


def _require(ok: bool, name: str, value: Any, expected: str) -> None:
    if not ok:
        raise CostSettingsError(f"{name} {_shown(value)}: expected {expected}")


def _shown(value: Any) -> str:
    text = str(value)
    return repr(text if len(text) <= 40 else text[:37] + "...")


@dataclass(frozen=True)
class CostSettings:
    """How to estimate a run. `gpu_hour_price` is the dedicated price of one GPU-hour in any currency (None:
    runs are estimated in GPU-hours only); `mtbe_hours` is the mean time between evictions of one
    low-priority node."""

    gpu_hour_price: float | None = None
    spot_discount: float = DEFAULT_SPOT_DISCOUNT
    expected_train_hours: float = DEFAULT_EXPECTED_TRAIN_HOURS
    mtbe_hours: float = DEFAULT_MTBE_HOURS
    checkpoint_every_hours: float = DEFAULT_CHECKPOINT_EVERY_HOURS
    restart_overhead_hours: float = DEFAULT_RESTART_OVERHEAD_HOURS
    low_priority_computes: frozenset[str] = field(
        default_factory=lambda: compute_defaults().low_priority_computes
    )
    default_train_compute: str = field(default_factory=lambda: compute_defaults().train_compute)

    def __post_init__(self) -> None:
        price = self.gpu_hour_price
        _require(
            price is None or (is_finite_number(price) and price > 0),
            GPU_HOUR_PRICE,
            price,
            "a price per GPU-hour > 0, e.g. 3.67 (unset it to estimate GPU-hours only)",
        )
        _require(
            is_finite_number(self.spot_discount) and 0 <= self.spot_discount < 1,
            SPOT_DISCOUNT,
            self.spot_discount,
            "a fraction in [0, 1), e.g. 0.6 for spot at 40 % of the dedicated price",
        )
        for name, value in (
            (EXPECTED_TRAIN_HOURS, self.expected_train_hours),
            (MTBE_HOURS, self.mtbe_hours),
            (CHECKPOINT_EVERY_HOURS, self.checkpoint_every_hours),
        ):
            _require(is_finite_number(value) and value > 0, name, value, "a number of hours > 0, e.g. 1.5")
        _require(
            is_finite_number(self.restart_overhead_hours) and self.restart_overhead_hours >= 0,
            RESTART_OVERHEAD_HOURS,
            self.restart_overhead_hours,
            "a number of hours >= 0, e.g. 0.1",
        )
        names = self.low_priority_computes
        if isinstance(names, str) or not all(isinstance(name, str) for name in names):
            raise CostSettingsError(
                f"{LOW_PRIORITY_COMPUTES} {_shown(names)}: expected a set of compute names"
            )
        plain = frozenset(_plain(name) for name in names)
        for name in sorted(plain):
            _require(bool(_COMPUTE_NAME.fullmatch(name)), LOW_PRIORITY_COMPUTES, name, _EXPECTED_COMPUTES)
        default = self.default_train_compute
        _require(
            isinstance(default, str) and bool(_COMPUTE_NAME.fullmatch(_plain(default))),
            "default train compute",
            default,
            "a compute name such as gpu-spot",
        )
        object.__setattr__(self, "low_priority_computes", plain)
        object.__setattr__(self, "default_train_compute", _plain(default))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CostSettings:
        """The settings the RETRAIN_* cost variables of `environ` name; an empty variable counts as unset."""
        values = {name: environ.get(name, "").strip() for name in COST_VARIABLES}
        values = {name: value for name, value in values.items() if value}
        numbers = {
            GPU_HOUR_PRICE: ("gpu_hour_price", "3.67"),
            SPOT_DISCOUNT: ("spot_discount", str(DEFAULT_SPOT_DISCOUNT)),
            EXPECTED_TRAIN_HOURS: ("expected_train_hours", "1.5"),
            MTBE_HOURS: ("mtbe_hours", str(DEFAULT_MTBE_HOURS)),
            CHECKPOINT_EVERY_HOURS: ("checkpoint_every_hours", str(DEFAULT_CHECKPOINT_EVERY_HOURS)),
            RESTART_OVERHEAD_HOURS: ("restart_overhead_hours", str(DEFAULT_RESTART_OVERHEAD_HOURS)),
        }
        chosen: dict[str, Any] = {}
        for name, (attribute, example) in numbers.items():
            if name in values:
                _require(
                    bool(_NUMBER.fullmatch(values[name])), name, values[name], f"a number such as {example}"
                )
                chosen[attribute] = float(values[name])
        if LOW_PRIORITY_COMPUTES in values:
            parts = values[LOW_PRIORITY_COMPUTES].split(",")
            chosen["low_priority_computes"] = frozenset(part.strip() for part in parts if part.strip())
        return cls(**chosen)

    def describe(self) -> str:
        """One line for a start-up log."""
        price = "unset" if self.gpu_hour_price is None else f"{self.gpu_hour_price:g}"
        return (
            f"gpu_hour_price={price} spot_discount={self.spot_discount:g} "
            f"expected_train_hours={self.expected_train_hours:g} mtbe_hours={self.mtbe_hours:g} "
            f"checkpoint_every_hours={self.checkpoint_every_hours:.4g} "
            f"restart_overhead_hours={self.restart_overhead_hours:g} "
            f"low_priority_computes={','.join(sorted(self.low_priority_computes)) or 'none'}"
        )


@dataclass(frozen=True)
class MeasuredTraining:
    """What one finished training of the model took: its wall time per optimizer step (saves included) on
    `world_size` processes, and its steps per epoch; `run_id` names the run that trained it."""

    run_id: str
    seconds_per_step: float
    steps_per_epoch: float
    world_size: int

    def __post_init__(self) -> None:
        for name in ("seconds_per_step", "steps_per_epoch"):
            value = getattr(self, name)
            if not is_finite_number(value) or value <= 0:
                raise CostSettingsError(
                    f"measured training of run {self.run_id}: {name} {value!r}; expected > 0"
                )
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise CostSettingsError(
                f"measured training of run {self.run_id}: world_size {self.world_size!r}; "
                "expected an integer >= 1"
            )

    def hours(self, epochs: float, gpus: int) -> float:
        """The uninterrupted hours of `epochs` on `gpus`: the same steps per epoch (a larger global batch
        takes fewer, longer steps: the product stays), each step's work shared by `gpus` instead of
        `world_size` processes, as if scaling were perfect."""
        return (
            self.seconds_per_step * self.steps_per_epoch * epochs * self.world_size / gpus / SECONDS_PER_HOUR
        )

    def describe(self, epochs: float) -> str:
        return (
            f"measured on run {self.run_id}: {self.seconds_per_step:.3g} s per step x "
            f"{self.steps_per_epoch:g} steps per epoch x {epochs:g} epochs, on {self.world_size} process(es) "
            "there"
        )


def _duration(hours: float) -> str:
    """Hours as a person reads them: `1.02 h` from a tenth of an hour, else `3.5 min` or `12.0 s`."""
    if hours >= 0.1:
        return f"{hours:.2f} h"
    return f"{hours * 60:.1f} min" if hours * 60 >= 1 else f"{hours * 3600:.1f} s"


def _amount(value: float) -> str:
    """Two decimals, or two significant digits below a hundredth (0.00031, not 0.00)."""
    return f"{value:.2f}" if value == 0 or abs(value) >= 0.01 else f"{value:.2g}"


@dataclass(frozen=True)
class CostEstimate:
    """One run's expected spend. `cost` is in the currency of the price (None when no price is set);
    `verdict` compares spot with dedicated, for a run on low-priority compute only."""

    gpus: int
    train_compute: str
    low_priority: bool
    expected_hours: float
    evictions: float
    wall_hours: float
    gpu_hours: float
    cost_vs_dedicated: float
    cost: float | None = None
    verdict: str | None = None
    # Where expected_hours came from: a measured training's words, or None for the setting.
    measured: str | None = None

    @property
    def basis(self) -> str:
        """Which train time the estimate used: measured on a run of the model, or the setting's."""
        if self.measured is not None:
            return f"train time {self.measured}"
        return f"train time assumed: {EXPECTED_TRAIN_HOURS}={self.expected_hours:g} h (no measured training)"

    @property
    def tier(self) -> str:
        return LOW_PRIORITY if self.low_priority else DEDICATED

    def summary(self) -> str:
        """One line for logs and the command line. A tiny training reads in minutes or seconds, and its
        GPU-hours and cost in significant digits: a measured few seconds is not "0.00 h = 0.00"."""
        head = "estimated cost unpriced" if self.cost is None else f"estimated cost {_amount(self.cost)}"
        tier = "low-priority" if self.low_priority else "dedicated"
        hours, gpu_hours = _duration(self.wall_hours), _amount(self.gpu_hours)
        text = (
            f"{head}: {self.gpus} GPU(s) x {hours} on {tier} compute {self.train_compute} = "
            f"{gpu_hours} GPU-hours"
        )
        if self.low_priority:
            text += f" ({self.evictions:.2f} expected evictions; {self.verdict})"
        if self.cost is None:
            text += f"; set {GPU_HOUR_PRICE} to the dedicated price of a GPU-hour to price it"
        return text

    def as_tags(self) -> dict[str, str]:
        """The estimate as job tags (strings); the cost only when a price is set."""
        tags = {
            GPUS_TAG: str(self.gpus),
            TIER_TAG: self.tier,
            WALL_HOURS_TAG: f"{self.wall_hours:.2f}",
            GPU_HOURS_TAG: f"{self.gpu_hours:.2f}",
            RATIO_TAG: f"{self.cost_vs_dedicated:.3f}",
        }
        if self.cost is not None:
            tags[COST_TAG] = f"{self.cost:.2f}"
        return tags

    def to_dict(self) -> dict[str, Any]:
        """The estimate as JSON values, with its summary, as a ledger records it."""
        return {
            "gpus": self.gpus,
            "train_compute": self.train_compute,
            "tier": self.tier,
            "expected_hours": self.expected_hours,
            "evictions": self.evictions,
            "wall_hours": self.wall_hours,
            "gpu_hours": self.gpu_hours,
            "cost_vs_dedicated": self.cost_vs_dedicated,
            "cost": self.cost,
            "summary": self.summary(),
        }


def train_compute(request: RunRequest, settings: CostSettings) -> str:
    """The compute the train step runs on: the request's, else the pipeline's."""
    return _plain(request.compute.get(TRAIN_STEP) or settings.default_train_compute)


def checkpoint_every_hours(request: RunRequest, settings: CostSettings) -> float | None:
    """The run's own checkpoint interval when its parameters set a number of seconds, None when they turn
    checkpoints off, else the setting."""
    value = request.parameters.get(CHECKPOINT_PARAMETER)
    if isinstance(value, str) and value.strip().lower() == NO_CHECKPOINTS:
        return None
    seconds = _positive_number(value)
    return settings.checkpoint_every_hours if seconds is None else seconds / SECONDS_PER_HOUR


def mtbe_hours(request: RunRequest, settings: CostSettings) -> float:
    """The run's own mean hours between evictions when its parameters set it, else the setting."""
    hours = _positive_number(request.parameters.get(MTBE_PARAMETER))
    return settings.mtbe_hours if hours is None else hours


def run_epochs(request: RunRequest) -> float:
    """The epochs `request` trains: its own parameter, else pipeline.yml's default."""
    epochs = _positive_number(request.parameters.get(EPOCHS_PARAMETER))
    if epochs is None:
        epochs = _positive_number(load_pipeline_spec().inputs.get(EPOCHS_PARAMETER))
    if epochs is None:
        raise SpecError(f"{PIPELINE_FILE}: expected a default number of '{EPOCHS_PARAMETER}' > 0")
    return epochs


def estimate_run_cost(
    request: RunRequest, settings: CostSettings, measured: MeasuredTraining | None = None
) -> CostEstimate:
    """The expected spend of `request`'s train step; the CPU steps cost little beside it and are left out.
    With `measured`, the train hours are the model's measured time at this run's epochs and GPUs."""
    compute = train_compute(request, settings)
    low_priority = compute in settings.low_priority_computes
    hours = settings.expected_train_hours
    basis = None
    if measured is not None:
        epochs = run_epochs(request)
        hours, basis = measured.hours(epochs, request.process_count), measured.describe(epochs)
    if low_priority:
        evictions = hours * request.instance_count / mtbe_hours(request, settings)
        scenario = SpotScenario(
            gpus=request.process_count,
            hours=hours,
            evictions=evictions,
            discount=settings.spot_discount,
            checkpoint_every=checkpoint_every_hours(request, settings),
            restart_overhead=settings.restart_overhead_hours,
        )
    else:
        evictions = 0.0
        scenario = SpotScenario(gpus=request.process_count, hours=hours, evictions=0.0, discount=0.0)
    spot = spot_estimate(scenario)
    price = settings.gpu_hour_price
    return CostEstimate(
        gpus=request.process_count,
        train_compute=compute,
        low_priority=low_priority,
        expected_hours=hours,
        evictions=evictions,
        wall_hours=spot.wall_hours,
        gpu_hours=spot.gpu_hours,
        cost_vs_dedicated=spot.cost_vs_dedicated,
        # The ratio already carries the discount: dedicated GPU-hours x ratio is what spot costs in them.
        cost=None if price is None else price * spot.dedicated_gpu_hours * spot.cost_vs_dedicated,
        verdict=spot.verdict if low_priority else None,
        measured=basis,
    )


def with_estimate(
    request: RunRequest, settings: CostSettings, measured: MeasuredTraining | None = None
) -> tuple[RunRequest, CostEstimate]:
    """`request` carrying its estimate in its job tags, and the estimate."""
    estimate = estimate_run_cost(request, settings, measured)
    return replace(request, job_tags={**request.job_tags, **estimate.as_tags()}), estimate
