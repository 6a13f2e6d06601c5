"""Speeds measured on a shared machine (lab/tracking/timing.py, lab/decode/paired.py, lab/report/speeds.py).

The contended case does not depend on what else the machine runs: the job is pinned to one core
and a busy-looping process to the same core, so the job's worker gets at most about half the wall
time (less when other work shares that core too). The uncontended case needs a core nobody else
uses, which a shared machine may not have: a 0.3 s busy-loop probe on the job's core before and
after the run must get ≥ 0.95 of the wall time, else the test is skipped, saying so (it cannot be
observed then; raising the job's priority would not help where the kernel groups processes by
session, and would take time from the machine's other users). Both cases run one intra-op
thread, so the load average, which other work drives, does not enter the rule.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
import torch

from lab.callbacks.throughput import TokenThroughput
from lab.decode import generate
from lab.decode.paired import median_quartiles, pair_order, paired_metrics, speed_ratio
from lab.tracking.timing import CPU_SHARE_MIN, LOAD_PER_CORE_MAX, Span, Stopwatch, is_contended
from tests.fit_helpers import compose_cfg, fit
from tests.helpers import build_model

pytestmark = pytest.mark.usefixtures("single_thread")
HOG_SECONDS = 60  # the hog's own bound: it never outlives a stuck test


def test_the_rule_at_its_thresholds():
    """Hand-made spans on both sides of each threshold."""
    assert is_contended(CPU_SHARE_MIN - 0.01, 1, 0.0, 0.0, 2) and not is_contended(CPU_SHARE_MIN + 0.01, 1, 0.0, 0.0, 2)
    overloaded = LOAD_PER_CORE_MAX * 2 + 0.5
    assert not is_contended(0.99, 1, overloaded, overloaded, 2)  # one thread that got its core ran, whatever the load
    assert is_contended(0.99, 2, overloaded, overloaded, 2)  # several threads: helpers may have starved
    assert not is_contended(0.99, 2, overloaded, 1.0, 2)  # load above the cores at one end only: a blip
    assert not is_contended(float("nan"), 2, float("nan"), float("nan"), 2)
    span = Span(wall_s=2.0, thread_cpu_s=1.0, threads=1, machine_cores=2)
    assert span.cpu_share == 0.5 and span.contended and span.record()["contended"] is True
    both = span.plus(Span(wall_s=2.0, thread_cpu_s=2.0, threads=1, machine_cores=2))
    assert both.cpu_share == 0.75 and Span.from_record(both.record()) == both


def test_a_stopwatch_counts_cpu_time_not_sleep():
    watch = Stopwatch()
    watch.start()
    time.sleep(0.2)  # waiting, like a thread without a core: wall time passes, CPU time does not
    interval = watch.stop()
    assert interval.wall_s >= 0.2 and interval.thread_cpu_s < 0.05 and interval.contended


FREE_CORE_SHARE = 0.95  # a probe's CPU share on a core nobody else uses


def probe_share(seconds: float = 0.3) -> float:
    """CPU share of a busy loop on this thread's cores: ≈ 1 on a free core."""
    watch = Stopwatch()
    watch.start()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return watch.stop().cpu_share


def skip_unless_core_free() -> None:
    share = probe_share()
    if share < FREE_CORE_SHARE:
        pytest.skip(f"the machine is busy (a busy loop got {share:.2f} of its core): the uncontended case cannot be observed here")


@contextmanager
def pinned_to_one_core(hog: bool):
    """This process on one core; with `hog`, a busy-looping process on the same core; without, a free core or a skip."""
    core = min(os.sched_getaffinity(0))
    saved_affinity = os.sched_getaffinity(0)
    hog_process = None
    try:
        os.sched_setaffinity(0, {core})
        if hog:
            loop = f"import os, time\nos.sched_setaffinity(0, {{{core}}})\nend = time.time() + {HOG_SECONDS}\nwhile time.time() < end: pass"
            hog_process = subprocess.Popen([sys.executable, "-c", loop])
            time.sleep(0.5)  # until it spins
        else:
            skip_unless_core_free()
        yield
        if not hog:
            skip_unless_core_free()  # the core stayed free while the job ran
    finally:
        if hog_process is not None:
            hog_process.kill()
            hog_process.wait()
        os.sched_setaffinity(0, saved_affinity)


# The uncontended half needs a free core, which a parallel suite (-n 2) rarely leaves: .ci/run runs it alone.
@pytest.mark.parametrize("hog", [True, pytest.param(False, marks=pytest.mark.serial)])
def test_a_training_run_beside_a_cpu_hog_is_flagged_contended(hog, tmp_path, cache_dir):
    throughput = TokenThroughput(peak_flops=None)
    cfg = compose_cfg("head=parallel", "head.k=2", "model.d_model=64", cache_dir=cache_dir)
    with pinned_to_one_core(hog):
        fit(cfg, tmp_path, max_steps=40, every=40, callbacks=[throughput])
    summary = throughput.summary()
    assert summary["train_threads"] == 1 and summary["train_thread_cpu_s"] <= summary["train_time_s"] * 1.02
    if hog:  # the job and the hog split one core
        assert summary["train_cpu_share"] < 0.65 and summary["train_contended"] is True
    else:
        assert summary["train_cpu_share"] > 0.9 and summary["train_contended"] is False
    assert summary["train_tokens_per_cpu_s"] == pytest.approx(summary["train_tokens"] / summary["train_thread_cpu_s"])


def test_paired_statistics_by_hand():
    """Ratios of speeds per pair, their median and quartiles, on both clocks."""
    slow, fast = Span(wall_s=2.0, thread_cpu_s=1.0), Span(wall_s=1.0, thread_cpu_s=1.0)
    assert speed_ratio(10, fast, 10, slow, "wall") == 2.0 and speed_ratio(10, fast, 10, slow, "cpu") == 1.0
    assert speed_ratio(10, fast, 5, fast, "wall") == 2.0  # tokens per second, not seconds
    assert median_quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0, 4.0) and median_quartiles([7.0]) == (7.0, 7.0, 7.0)
    metrics = paired_metrics([(10, fast, 10, slow), (10, slow, 10, slow), (10, fast, 10, fast)])
    assert metrics["decode/speedup"] == 1.0 and metrics["decode/speedup_q3"] == 1.5 and metrics["decode/speedup_cpu"] == 1.0
    assert metrics["decode/pairs"] == 3
    assert [pair_order(i, r) for i, r in ((0, 0), (1, 0), (0, 1))] == [(False, True), (True, False), (True, False)]


def always_seven(layers: int = 4):
    """An identity-head model (K = 3, drafts = the next-token logits) whose blocks pass the residual through and whose
    every logit row ranks token 7 first: greedy decoding emits 7 forever and every draft is accepted."""
    model = build_model("identity", 3, layers=layers).double().eval()
    with torch.no_grad():
        for block in model.trunk.blocks:
            block.attn.proj.weight.zero_(), block.mlp.down.weight.zero_()  # the blocks still compute, and add nothing
        model.trunk.embed.weight.fill_(0.1)
        model.trunk.embed.weight[7] = 0.2  # tied unembedding: logit(7) = 2 × every other logit > 0
    return model


NEW_TOKENS = 24
# Every draft accepted: 24 tokens in 1 prefill + 8 rounds of 3 = 9 target passes against plain decoding's 24. The
# speed ratio is 24/9 ≈ 2.67 when a 3-row pass costs one 1-row pass, less by the extra rows and drafting work. Band:
PAIRED_BAND = (1.5, 3.0)


def test_paired_speedup_of_a_draft_equal_to_its_target_under_load():
    """Decoded beside a hog on the same core (the worker gets about half the wall time), the paired median, from wall
    time and from CPU time, stays in the band the work alone sets: each pair sees the same load."""
    from lab.decode.evaluation import paired_runs

    model = always_seven()
    stats = generate(model, torch.tensor([1, 2, 3, 4]), NEW_TOKENS, speculative=True).stats
    assert stats["accepted_by_position"] == stats["proposed_by_position"] and stats["target_forwards"] == 9
    with pinned_to_one_core(hog=True):
        _, pairs, span = paired_runs(model, [[1, 2, 3, 4], [5, 6, 7, 8]], NEW_TOKENS, 0.0, 0, repeats=4)
    metrics = paired_metrics([pair for prompt in pairs for pair in prompt])
    assert metrics["decode/pairs"] == 8 and span.contended and span.cpu_share < 0.65
    low, high = PAIRED_BAND
    assert low <= metrics["decode/speedup"] <= high and low <= metrics["decode/speedup_cpu"] <= high, metrics
    assert metrics["decode/speedup_q1"] <= metrics["decode/speedup"] <= metrics["decode/speedup_q3"]
