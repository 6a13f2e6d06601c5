"""Device-agnostic audit of the step's model and objective code, run on CPU.

On CPU every tensor lives on the host, so a tensor built without a device (`torch.tensor(list)`)
works here and breaks on CUDA (a CPU tensor mixed into device reductions, or a hidden copy).
Two of torch's own mechanisms watch the forward, the coefficients, the backward schedule and
the backward pass of one step, for every head and schedule:

- a TorchFunctionMode records every tensor factory called from `lab/` without a `device`
  (only the λ schedule may: host-side config, moved with `.to(counts.device)`);
- a TorchDispatchMode counts the operations that wait for the device on CUDA: scalar reads
  (`.item()`, `.tolist()`, `bool(tensor)`) — none allowed here; the step's single read sits
  in `lab/step.py` outside this region — and boolean-mask row gathers, which need the row
  count on the host. Those are the known remaining syncs: 2 per horizon in the forward
  (`supervised_rows`: rows and labels) and 1 per horizon in the backward (index_put), pinned
  here so that a new one is noticed.
"""

import sys
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lab.objective import Progress
from lab.objective.objective import Objective
from tests.helpers import build_model, packed_batch

FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.eye,
             torch.linspace, torch.rand, torch.randn, torch.randint, torch.scalar_tensor}
HOST_SIDE = {"lab/objective/weights.py"}  # λ values: config on the host, moved to the counts' device
LAB = "/lab/"


def lab_caller() -> str | None:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if LAB in name and "/torch/" not in name:
            return "lab/" + name.split(LAB, 1)[1] + f":{frame.f_lineno}"
        frame = frame.f_back
    return None


class DevicelessFactories(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            where = lab_caller()
            if where is not None:
                self.calls.append(where)
        return func(*args, **kwargs)


class DeviceWaits(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default):
            self.ops["scalar_read" if func is torch.ops.aten._local_scalar_dense.default else "nonzero"] += 1
        elif func.__name__.startswith("index") and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in tree_leaves((args[1:], kwargs))
        ):
            self.ops["mask_gather"] += 1
        return func(*args, **kwargs)


HEADS = [dict(name="ntp"), dict(name="linear", k=3), dict(name="parallel", k=3), dict(name="causal", k=3),
         dict(name="anticausal", k=3, compute_match="none"), dict(name="deepseek", k=3, depth=2)]


@pytest.mark.parametrize("schedule", ["joint", "sequential", "chunked"])
@pytest.mark.parametrize("head", HEADS, ids=lambda h: h["name"])
def test_step_builds_no_host_tensors_and_reads_nothing_back(head, schedule):
    model = build_model(**head, layers=4)
    objective = Objective.build({"policy": "head_mean"}, {"name": "linear_decay"}, {"name": schedule, "chunk_rows": 4}, k=model.k)
    batch = packed_batch()
    factories, waits = DevicelessFactories(), DeviceWaits()
    with factories, waits:
        horizons = model(batch)
        local = torch.stack([h.mask.sum() for h in horizons]).to(torch.float64)  # [K], as lab.training.step.local_counts
        coeffs = objective.coefficients(local, batch["tokens"].numel(), Progress(3, 100, 10))
        root, stats = objective.backward_schedule.run(horizons, coeffs.applied)
        root.backward()
    assert {call.split(":")[0] for call in factories.calls} <= HOST_SIDE, factories.calls
    k = model.k
    assert waits.ops == Counter(mask_gather=3 * k), dict(waits.ops)
    # everything the step hands on lives where the rows live
    for tensor in (stats.loss_sums, stats.counts, coeffs.coefficients, root):
        assert tensor.device == horizons[0].hidden.device


def test_the_audit_sees_a_host_tensor_and_a_scalar_read():
    """The instruments themselves: what the old per-horizon counts did is caught."""
    factories, waits = DevicelessFactories(), DeviceWaits()
    rows = torch.ones(4, 2)
    with factories, waits:
        counts = [int(rows.sum().item())]
        exec(compile("torch.tensor(counts)", "/x/lab/objective/backward.py", "eval"), {"torch": torch, "counts": counts})
    assert waits.ops["scalar_read"] == 1
    assert [c.split(":")[0] for c in factories.calls] == ["lab/objective/backward.py"]
