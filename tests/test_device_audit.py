"""Device-agnostic audit of the step's model and objective code, run on CPU.

On CPU every tensor lives on the host, so a tensor built without a device (`torch.tensor(list)`)
works here and breaks on CUDA (a CPU tensor mixed into device reductions, or a hidden copy).
Two of torch's own mechanisms watch `train_step` itself (forward, coefficients, backward schedule,
loss and backward; not torch's optimizer update), for every head and schedule:

- a TorchFunctionMode records every tensor factory called from `lab/` without a `device`
  (only the λ schedule may: host-side config, moved with `.to(counts.device)`);
- a TorchDispatchMode counts the operations that wait for the device on CUDA: scalar reads
  (`.item()`, `.tolist()`, `bool(tensor)`) — only the step's single transfer (loss and token
  count, for the finiteness check) — and boolean-mask row gathers, which need the row
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
from lab.training.step import train_step
from tests.head_cases import case, cases
from tests.helpers import build_model, packed_batch

FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.eye,
             torch.linspace, torch.rand, torch.randn, torch.randint, torch.scalar_tensor}
HOST_READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__}
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
    """Device-less tensor factories called from lab/ (`calls`), and host reads of tensor values (`host_reads`:
    on CPU `.tolist()` reaches no dispatch op, so the dispatch mode below cannot see it)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []
        self.host_reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        where = lab_caller()
        if func in FACTORIES and kwargs.get("device") is None and where is not None:
            self.calls.append(where)
        if func in HOST_READS and where is not None:
            self.host_reads.append(where)
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


HEADS = list({**cases(), "anticausal": case("anticausal", compute_match="none")}.values())  # every registered head


class BackwardOnly:
    """The step's gradient work without the optimizer update: torch's AdamW is not the harness's code to audit."""

    def zero_grad(self) -> None:
        pass

    def backward(self, root: torch.Tensor) -> None:
        root.backward()

    def update(self) -> None:
        pass


@pytest.mark.parametrize("schedule", ["joint", "sequential", "chunked"])
@pytest.mark.parametrize("head", HEADS, ids=lambda h: h["name"])
def test_step_builds_no_host_tensors_and_reads_back_once(head, schedule):
    """`train_step` itself, forward to backward: no device-less factory outside the λ schedule, one host read."""
    model = build_model(**head, layers=4)
    objective = Objective.build({"policy": "head_mean"}, {"name": "linear_decay"}, {"name": schedule, "chunk_rows": 4}, k=model.k)
    batch = packed_batch()
    factories, waits = DevicelessFactories(), DeviceWaits()
    with factories, waits:
        out = train_step(model, objective, batch, Progress(3, 100, 10), BackwardOnly())
    assert {call.split(":")[0] for call in factories.calls} <= HOST_SIDE, factories.calls
    k = model.k
    assert waits.ops == Counter(mask_gather=3 * k), dict(waits.ops)
    # the step's one transfer: loss and token count in one `.tolist()` (the finiteness check)
    assert [read.split(":")[0] for read in factories.host_reads] == ["lab/training/step.py"], factories.host_reads
    # everything the step hands on lives where the rows live
    for tensor in (out.loss, out.loss_sums, out.counts, out.coefficients):
        assert tensor.device == batch["tokens"].device
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_the_audit_sees_a_host_tensor_and_a_scalar_read():
    """The instruments themselves: what the old per-horizon counts did is caught."""
    factories, waits = DevicelessFactories(), DeviceWaits()
    rows = torch.ones(4, 2)
    with factories, waits:
        counts = [int(rows.sum().item())]
        exec(compile("torch.tensor(counts)", "/x/lab/objective/backward.py", "eval"), {"torch": torch, "counts": counts})
    assert waits.ops["scalar_read"] == 1
    assert [c.split(":")[0] for c in factories.calls] == ["lab/objective/backward.py"]
