"""The MTP objective: reduction policies, loss-weight schedules, backward schedules.

Public API (docs/api.md): `POLICIES`, `coefficients`, `logit_bytes`.
"""

from lab.objective.backward import BACKWARD_SCHEDULES, HorizonStats, build_backward_schedule, evaluate_horizons
from lab.objective.logit_bytes import logit_bytes
from lab.objective.reductions import POLICIES, coefficients, effective_weights, reduced_loss, validate_reduction
from lab.objective.weights import WEIGHT_SCHEDULES, Progress, build_weight_schedule

__all__ = [
    "BACKWARD_SCHEDULES",
    "HorizonStats",
    "POLICIES",
    "Progress",
    "WEIGHT_SCHEDULES",
    "build_backward_schedule",
    "build_weight_schedule",
    "coefficients",
    "effective_weights",
    "evaluate_horizons",
    "logit_bytes",
    "reduced_loss",
    "validate_reduction",
]
