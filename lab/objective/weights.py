"""Loss-weight schedules: λ_k per horizon as a function of training progress.

A schedule is a pure function of `Progress` (step, consumed tokens, total steps):
it keeps no state, so a resumed run gets the same λ as long as the step and the
consumed-token count are restored from the checkpoint.

Horizon 1 (the next-token objective) has λ_1 = 1 in every parametric schedule;
only the extra horizons k ≥ 2 are scheduled. With K = 1 every schedule gives [1.0]
(the explicit `uniform` list is the one exception: it is taken as written).
Any averaging over extra depths (DeepSeek's λ/D) lives here, not in the reduction.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import torch
from torch import Tensor

from lab.errors import require, require_number
from lab.schema import check_known


@dataclass(frozen=True)
class Progress:
    """Where training stands; everything a schedule may depend on."""

    step: int
    consumed_tokens: int
    total_steps: int

    def __post_init__(self) -> None:
        require(self.total_steps >= 1, "trainer.max_steps", f"must be ≥ 1, got {self.total_steps}")
        require(self.step >= 0, "progress.step", f"must be ≥ 0, got {self.step}")
        require(self.consumed_tokens >= 0, "progress.consumed_tokens", f"must be ≥ 0, got {self.consumed_tokens}")

    @property
    def last_step_fraction(self) -> float:
        """step / (total_steps - 1) clipped to [0, 1]: 0 at the first step, 1 at the last one.

        Steps are 0-based, so a run of `total_steps` steps ends at step total_steps - 1; an
        interpolating schedule reaches its end value there. A 1-step run has only step 0,
        which counts as the start (the extra heads still train).
        """
        if self.total_steps == 1:
            return 0.0
        return min(self.step, self.total_steps - 1) / (self.total_steps - 1)


# ---------------------------------------------------------------- validation helpers


def _number(value: Any, field: str) -> float:
    require_number(value, field)
    return float(value)


def _non_negative(value: Any, field: str) -> float:
    require_number(value, field, low=0)
    return float(value)


def _positive(value: Any, field: str) -> float:
    require_number(value, field, low=0, open_low=True)
    return float(value)


def _token_count(value: Any, field: str) -> int:
    """A whole number ≥ 0; ints pass through untouched (token counts can exceed 2^53)."""
    if isinstance(value, bool) or not isinstance(value, int):
        number = _non_negative(value, field)
        require(number == int(number), field, f"must be a whole number of tokens, got {value!r}")
        value = int(number)
    require(value >= 0, field, f"must be ≥ 0, got {value!r}")
    return value


def _vector(values: Sequence[float]) -> Tensor:
    return torch.tensor(list(values), dtype=torch.float64)


def _main_then_extra(k: int, extra: Sequence[float]) -> Tensor:
    """[1, extra_2, …, extra_K]: horizon 1 is never down-weighted."""
    assert len(extra) == k - 1
    return _vector([1.0, *extra])


# ---------------------------------------------------------------- schedules


@dataclass(frozen=True)
class WeightSchedule:
    """Base: `k` horizons; subclasses implement `lambdas(progress)`."""

    k: int

    def __post_init__(self) -> None:
        require(isinstance(self.k, int) and self.k >= 1, "head.k", f"must be an integer ≥ 1, got {self.k!r}")

    def lambdas(self, progress: Progress) -> Tensor:
        raise NotImplementedError

    def live_horizons(self, progress: Progress) -> int:
        """n: horizons n+1..K have λ = 0 from this step to the end of training, so a step may skip them."""
        return self.k


@dataclass(frozen=True)
class Uniform(WeightSchedule):
    """λ_k = 1, or an explicit user list `lambdas` of length K (finite, ≥ 0)."""

    explicit_lambdas: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.explicit_lambdas is None:
            return
        values = _explicit_lambdas(self.explicit_lambdas, self.k)
        object.__setattr__(self, "explicit_lambdas", values)

    def lambdas(self, progress: Progress) -> Tensor:
        return _vector(self.explicit_lambdas if self.explicit_lambdas is not None else [1.0] * self.k)


def _explicit_lambdas(values: Any, k: int) -> tuple[float, ...]:
    require(_is_list_like(values), "weights.lambdas", f"must be a list of {k} numbers, got {values!r}")
    values = list(values)
    require(len(values) == k, "weights.lambdas", f"must have K = {k} entries, got {len(values)}")
    return tuple(_non_negative(v, "weights.lambdas") for v in values)


def _is_list_like(values: Any) -> bool:
    # Hydra hands lists over as ListConfig, which is iterable but not a Sequence.
    return isinstance(values, Iterable) and not isinstance(values, (str, bytes, Mapping))


@dataclass(frozen=True)
class _PowerDecay(WeightSchedule):
    """λ_k = r^(k-1) for a ratio r > 0 that each subclass names after its source (its config option)."""

    ratio_option: ClassVar[str]

    def __post_init__(self) -> None:
        super().__post_init__()
        ratio = _positive(getattr(self, self.ratio_option), f"weights.{self.ratio_option}")
        object.__setattr__(self, self.ratio_option, ratio)

    def lambdas(self, progress: Progress) -> Tensor:
        ratio = getattr(self, self.ratio_option)
        return _vector([ratio ** (k - 1) for k in range(1, self.k + 1)])


@dataclass(frozen=True)
class Geometric(_PowerDecay):
    """λ_k = γ^(k-1): distant horizons are noisier, so they get geometrically less weight."""

    ratio_option: ClassVar[str] = "gamma"
    gamma: float = 0.5


@dataclass(frozen=True)
class Medusa(_PowerDecay):
    """Medusa weights its i-th extra head (i = 1, 2, …) by base^i, base = 0.8.

    That extra head predicts horizon k = i + 1, so λ_k = base^(k-1), and λ_1 = 1
    for the next-token head.
    """

    ratio_option: ClassVar[str] = "base"
    base: float = 0.8


@dataclass(frozen=True)
class DeepSeek(WeightSchedule):
    """DeepSeek-V3: L = L_main + (λ/D) Σ_d L_mtp(d), D = K - 1 extra depths.

    λ = `initial` before the switch, `final` from it on. The paper switches after 10T of
    its 14.8T training tokens, i.e. at 67.6 % of training. The switch is given either

    - as a fraction of training, `switch_at` (default 0.676, the paper's proportion):
      steps with step / total_steps < switch_at use `initial` (with a fixed batch size,
      steps are proportional to training tokens); or
    - in consumed (active, all ranks) tokens, `switch_tokens`: `initial` while
      consumed_tokens < switch_tokens. When set, it takes precedence over `switch_at`.
    """

    initial: float = 0.3
    final: float = 0.1
    switch_at: float | None = 0.676
    switch_tokens: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "initial", _non_negative(self.initial, "weights.initial"))
        object.__setattr__(self, "final", _non_negative(self.final, "weights.final"))
        if self.switch_tokens is not None:
            object.__setattr__(self, "switch_tokens", _token_count(self.switch_tokens, "weights.switch_tokens"))
            return
        require(self.switch_at is not None, "weights.switch_at", "set a fraction of training in [0, 1] or weights.switch_tokens")
        switch_at = _number(self.switch_at, "weights.switch_at")
        require(0 <= switch_at <= 1, "weights.switch_at", f"must be a fraction of training in [0, 1], got {self.switch_at!r}")
        object.__setattr__(self, "switch_at", switch_at)

    def switched(self, progress: Progress) -> bool:
        if self.switch_tokens is not None:
            return progress.consumed_tokens >= self.switch_tokens
        # step / total_steps (not step < switch_at · total_steps): an integer ratio rounds to
        # the same double as the decimal literal, so 676/1000 switches exactly at 0.676.
        return progress.step / progress.total_steps >= self.switch_at

    def mtp_weight(self, progress: Progress) -> float:
        return self.final if self.switched(progress) else self.initial

    def lambdas(self, progress: Progress) -> Tensor:
        depths = self.k - 1
        per_depth = self.mtp_weight(progress) / depths if depths else 0.0
        return _main_then_extra(self.k, [per_depth] * depths)


@dataclass(frozen=True)
class LinearDecay(WeightSchedule):
    """Extra-horizon weight goes linearly from `start` at step 0 to `end` at the last step
    (total_steps - 1), and stays at `end` past it."""

    start: float = 1.0
    end: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "start", _non_negative(self.start, "weights.start"))
        object.__setattr__(self, "end", _non_negative(self.end, "weights.end"))

    def lambdas(self, progress: Progress) -> Tensor:
        f = progress.last_step_fraction
        # (1 - f)·start + f·end rather than start + f·(end - start): exact at both ends.
        weight = (1.0 - f) * self.start + f * self.end
        return _main_then_extra(self.k, [weight] * (self.k - 1))


@dataclass(frozen=True)
class Anneal(WeightSchedule):
    """Extra-horizon weight follows a cosine from `start` at step 0 to 0 at the last step:
    start · (1 + cos(π · f)) / 2, f = step / (total_steps - 1) (MTP as an auxiliary
    objective that hands over to pure next-token training by the end).
    """

    start: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "start", _non_negative(self.start, "weights.start"))

    def lambdas(self, progress: Progress) -> Tensor:
        # cos(π) = -1 exactly in floating point, so the last step's weight is exactly 0.
        weight = self.start * 0.5 * (1.0 + math.cos(math.pi * progress.last_step_fraction))
        return _main_then_extra(self.k, [weight] * (self.k - 1))


def forward_active_horizons(k: int, progress: Progress) -> int:
    """Horizons 1..n are active, n = 1 + floor(K · step / total_steps), clipped to K.

    Training splits into K equal phases; phase p (0-based) trains horizons 1..p+1.
    Integer arithmetic keeps the phase boundaries exact.
    """
    step = min(progress.step, progress.total_steps)
    return min(k, 1 + (k * step) // progress.total_steps)


@dataclass(frozen=True)
class CurriculumForward(WeightSchedule):
    """Horizons are switched on one by one: n_active grows 1 → K (see forward_active_horizons)."""

    def active_horizons(self, progress: Progress) -> int:
        return forward_active_horizons(self.k, progress)

    def lambdas(self, progress: Progress) -> Tensor:
        return _first_n_active(self.k, self.active_horizons(progress))


@dataclass(frozen=True)
class CurriculumReverse(WeightSchedule):
    """Mirror of the forward curriculum: n_active = K + 1 - n_forward, shrinking K → 1.

    The farthest horizons switch off first; horizon 1 is always active.
    """

    def active_horizons(self, progress: Progress) -> int:
        return self.k + 1 - forward_active_horizons(self.k, progress)

    def lambdas(self, progress: Progress) -> Tensor:
        return _first_n_active(self.k, self.active_horizons(progress))


def _first_n_active(k: int, n_active: int) -> Tensor:
    return _vector([1.0] * n_active + [0.0] * (k - n_active))


@dataclass(frozen=True)
class Phased(WeightSchedule):
    """Phases over training, each giving λ per horizon as a constant or a linear `[start, end]` ramp.

    `phases`: one list per phase, entry k-1 for horizon k, a number or a [start, end] pair;
    horizons a phase leaves out have λ = 0 in it (the modded-nanogpt record's
    `[1, 0.5, [0.25, 0]] → [1, [0.5, 0]] → [1]`). `boundaries`: the fractions of training where
    phases 1..P-1 end (null: P equal parts). At f = step / total_steps phase p = the first one
    with f < its end, and a ramp runs from `start` at the phase's first fraction to `end` at its
    last (the next phase takes over there). Fractions are exact rationals, so a boundary at 1/3
    of 6 steps falls exactly on step 2.
    """

    # the default: the modded-nanogpt speed-run record's (2025-12-22) over thirds of training
    phases: tuple = ((1.0, 0.5, (0.25, 0.0)), (1.0, (0.5, 0.0)), (1.0,))
    boundaries: tuple | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(_is_list_like(self.phases) and len(list(self.phases)) >= 1, "weights.phases",
                f"must be a list of phases (one list of per-horizon λ each), got {self.phases!r}")
        phases = tuple(self._phase(i, phase) for i, phase in enumerate(self.phases, start=1))
        object.__setattr__(self, "phases", phases)
        object.__setattr__(self, "boundaries", self._ends(len(phases)))

    def _phase(self, index: int, phase: Any) -> tuple[tuple[float, float], ...]:
        """((start, end) for horizons 1..K): missing horizons are 0."""
        field = f"weights.phases[{index - 1}]"
        require(_is_list_like(phase), field, f"must be a list of per-horizon λ (numbers or [start, end]), got {phase!r}")
        entries = list(phase)
        require(len(entries) <= self.k, field, f"gives {len(entries)} horizons, K = {self.k}")
        ramps = []
        for entry in entries:
            pair = list(entry) if _is_list_like(entry) else [entry, entry]
            require(len(pair) == 2, field, f"a ramp is [start, end], got {entry!r}")
            ramps.append(tuple(_non_negative(v, field) for v in pair))
        return tuple(ramps) + ((0.0, 0.0),) * (self.k - len(ramps))

    def _ends(self, n_phases: int) -> tuple[Fraction, ...]:
        """The end fraction of every phase (the last ends at 1)."""
        if self.boundaries is None:
            return tuple(Fraction(p, n_phases) for p in range(1, n_phases + 1))
        given = list(self.boundaries) if _is_list_like(self.boundaries) else None
        require(given is not None and len(given) == n_phases - 1, "weights.boundaries",
                f"must list the end of every phase but the last ({n_phases - 1} fractions) or be null, got {self.boundaries!r}")
        ends = [Fraction(str(_number(b, "weights.boundaries"))) for b in given] + [Fraction(1)]
        require(all(a < b for a, b in zip([Fraction(0)] + ends, ends)), "weights.boundaries",
                f"must be strictly increasing fractions in (0, 1), got {self.boundaries!r}")
        return tuple(ends)

    def _position(self, progress: Progress) -> tuple[int, Fraction]:
        """(phase index, how far through it in [0, 1))."""
        f = Fraction(min(progress.step, progress.total_steps - 1), progress.total_steps)
        phase = next(p for p, end in enumerate(self.boundaries) if f < end)
        start = self.boundaries[phase - 1] if phase else Fraction(0)
        return phase, (f - start) / (self.boundaries[phase] - start)

    def lambdas(self, progress: Progress) -> Tensor:
        phase, t = self._position(progress)
        t = float(t)
        # (1 - t)·start + t·end: exact at both ends of a ramp
        return _vector([(1.0 - t) * start + t * end for start, end in self.phases[phase]])

    def live_horizons(self, progress: Progress) -> int:
        phase, _ = self._position(progress)
        now = self.lambdas(progress).tolist()

        def retired(k: int) -> bool:  # λ_k is 0 now and in every later step
            later = [ramp for p in self.phases[phase + 1 :] for ramp in [p[k - 1]]]
            return now[k - 1] == 0 and self.phases[phase][k - 1][1] == 0 and all(ramp == (0.0, 0.0) for ramp in later)

        return max([1] + [k for k in range(1, self.k + 1) if not retired(k)])


WEIGHT_SCHEDULES: dict[str, type[WeightSchedule]] = {
    "uniform": Uniform,
    "geometric": Geometric,
    "medusa": Medusa,
    "deepseek": DeepSeek,
    "linear_decay": LinearDecay,
    "curriculum_forward": CurriculumForward,
    "curriculum_reverse": CurriculumReverse,
    "anneal": Anneal,
    "phased": Phased,
}

# Config option name → dataclass field name, where the field must differ
# (Uniform's field cannot be called `lambdas`: that is its method).
_OPTION_FIELDS = {"lambdas": "explicit_lambdas"}


def build_weight_schedule(name: str, k: int, **options: Any) -> WeightSchedule:
    """Build schedule `name` for `k` horizons; unknown names or options raise ConfigError."""
    require(name in WEIGHT_SCHEDULES, "weights.name", f"unknown {name!r}; allowed: {', '.join(WEIGHT_SCHEDULES)}")
    cls = WEIGHT_SCHEDULES[name]
    check_known("weights", options, _options_of(cls), owner=f"schedule {name!r}")
    return cls(k=k, **{_OPTION_FIELDS.get(option, option): value for option, value in options.items()})


def _options_of(cls: type[WeightSchedule]) -> list[str]:
    return [option for option, _ in schedule_options(cls)]


def schedule_options(cls: type[WeightSchedule]) -> list[tuple[str, dataclasses.Field]]:
    """(config option, dataclass field) of every option of schedule `cls` (K comes from the head, not the config)."""
    field_to_option = {field: option for option, field in _OPTION_FIELDS.items()}
    return [(field_to_option.get(f.name, f.name), f) for f in dataclasses.fields(cls) if f.name != "k"]
