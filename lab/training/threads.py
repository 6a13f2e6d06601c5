"""`trainer.threads`: how many intra-op threads torch computes with. Chosen from the config, never from the load.

Why: the thread count changes a run's digits. torch's CPU kernels split reductions (matmul blocks, sums,
softmax) differently with 1 and 2 threads, so at the main job's size (d=96, 16×128 tokens, 240 steps) one ntp
job ends at another validation loss on 1 thread than on 2 (a 0.03-nat shift measured on an AMX Xeon, larger
than some gaps a report ranks). A count read off the machine's load gave a run other numbers on a busy machine
than on an idle one, and a resume under another load continued on another count. So:

    auto, a small model (< SMALL_MODEL_PARAMS parameters):  1 thread, on every machine and under any load.
          A sweep uses the cores by running jobs side by side instead (conf/hydra/launcher/parallel.yaml): one job
          per usable core, each on one thread; side by side, two one-thread jobs do more work per second than one
          job on two threads (no per-op synchronisation), and neither's numbers depend on the other.
    auto, a larger model: the usable cores, divided among the jobs a parallel sweep runs side by side. A pretrained
          trunk (SmolLM2: 135 M) trains for hours, and intra-op threads are the only way one run uses the cores;
          its digits depend on that count, which run.json records (`threads`, `numerics`).
    an integer: exactly that many.
    a resume: the count the run recorded; a different explicit count, or fewer usable cores, is refused in one line.

The line sits at 20 M parameters: every GPT preset in conf/model below gpt2_small (124 M) and every main-job
architecture (0.69–0.75 M) are under it, every pretrained trunk is over it. The choice is said in one console
line and recorded in run.json.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

AUTO = "auto"
SMALL_MODEL_PARAMS = 20_000_000


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    setting: str  # "auto" or the number given
    reason: str

    def record(self) -> dict:
        return {"setting": self.setting, "threads": self.threads, "reason": self.reason}


def check_threads(setting) -> None:
    from lab.errors import require
    from lab.errors import is_int

    ok = setting == AUTO or (is_int(setting) and setting >= 1)
    require(ok, "trainer.threads", f"must be 'auto' or an integer ≥ 1 (intra-op threads), got {setting!r}")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def choose_threads(setting, params: int, side_by_side: int = 1, recorded: int | None = None) -> ThreadChoice:
    """The run's intra-op threads from its setting, its model's parameter count, the jobs its sweep runs side by side
    and (a resume) the count it recorded. Nothing here reads the machine's load."""
    check_threads(setting)
    if recorded is not None:
        return resumed_threads(setting, recorded)
    if setting != AUTO:
        return ThreadChoice(int(setting), str(setting), "set in trainer.threads")
    if params < SMALL_MODEL_PARAMS:
        return ThreadChoice(1, AUTO, f"a model of {params / 1e6:.2f} M parameters (< {SMALL_MODEL_PARAMS / 1e6:g} M) computes on one thread")
    cores = usable_cores()
    threads = max(1, cores // max(1, side_by_side))
    beside = f", shared by {side_by_side} jobs side by side" if side_by_side > 1 else ""
    return ThreadChoice(threads, AUTO, f"a model of {params / 1e6:.0f} M parameters computes on the {cores} usable cores{beside}")


def resumed_threads(setting, recorded: int) -> ThreadChoice:
    """A resume computes on the thread count its run recorded, or is refused naming both counts."""
    from lab.errors import require

    require(setting == AUTO or int(setting) == recorded, "trainer.threads",
            f"the run being resumed computed on {recorded} threads, this resume asks for {setting}: a resume computes on its "
            f"recorded count (leave trainer.threads=auto, or give {recorded})")
    cores = usable_cores()
    require(recorded <= cores, "trainer.threads",
            f"the run being resumed computed on {recorded} threads, this process may use {cores} cores: resume it where "
            f"{recorded} cores are usable (its numbers depend on the count), or start a new run from its weights with init_from")
    return ThreadChoice(recorded, str(setting), "recorded by the run being resumed")


def apply_threads(choice: ThreadChoice) -> None:
    import torch

    torch.set_num_threads(choice.threads)


def sweep_jobs_side_by_side() -> int:
    """How many jobs the parallel launcher runs at once: one per usable core (Hydra resolves `${lab_sweep_jobs:}`)."""
    return usable_cores()
