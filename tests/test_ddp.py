"""Data-parallel exactness of the objective (docs/architecture.md, the training step) on a real 2-process DDP.

`tests/ddp_worker.py` trains `MTPLitModule` for exactly one step per case, either on
one process with the whole global batch (4 rows x 16) or under Lightning's DDP
strategy (gloo, CPU, 2 processes, rank r gets rows 2r and 2r+1; the ranks hold very
different valid counts at every horizon). It saves the loss and every parameter's
gradient (after DDP's all-reduce, before the optimizer step). Both runs are launched
once per test session (concurrently) and hold all cases, so DDP start-up is paid once.

λ is non-uniform (geometric, γ = 0.5) in every case.

Checked here:
1. every policy in POLICIES with count_scope=global: the 2-process loss and gradients
   equal the 1-process ones (float32, relative 1e-5);
2. count_scope=local with head_mean is NOT the global objective: the difference is
   measured, printed and required to exceed 1e-4 relative;
3. joint / sequential / chunked backward schedules agree under DDP and equal the
   1-process result (DeepSeek depth 2, head_mean);
4. the per-horizon metrics the real `HorizonMetrics` callback logs (train/loss, acc, count,
   weight_eff per horizon) equal the 1-process run's, for every policy, every head
   architecture (weighted_pair) and both count scopes; under count_scope=local the
   loss-share weight_eff is Σ_r c_k^r N_k^r / Σ_r Σ_j c_j^r N_j^r, checked by hand;
5. validation over 5 rows (odd: they don't divide by the 2 ranks) counts every row once, from
   stored rows and from a stream: counts, losses and bits equal the 1-process validation.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lab.objective import POLICIES
from tests.head_cases import case, without
from tests.cli import SUBPROCESS_TIMEOUT, cli_env, kill_session

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "ddp_worker.py"
RTOL, ATOL = 1e-5, 1e-7
SCHEDULES = ("joint", "sequential", "chunked")

PARALLEL_K4 = {"name": "parallel", "k": 4}
DEEPSEEK_D2 = {"name": "deepseek", "depth": 2, "k": None}
EVERY_HEAD = {  # every registered head but identity and medusa (each case is a 2-process DDP run)
    **without("identity", "medusa"),
    "anticausal": case("anticausal", compute_match="none"),  # 3 head blocks on the next-token path
}
VAL_ROWS = 5  # odd: Lightning's default sampler would pad rank 1 with a repeat of row 0
VALIDATION_DATA = {"source": "stdlib", "max_docs": 8, "seq_len": 16, "batch_size": 2, "max_val_rows": VAL_ROWS}
PER_HORIZON = ("loss", "acc", "count", "weight_eff")


def reduction(policy: str, scope: str = "global") -> dict:
    # fixed_denominator None: `fixed` / `deepseek_paper` use the (global) token positions.
    return {"policy": policy, "count_scope": scope, "fixed_denominator": None}


def schedule(name: str) -> dict:
    return {"name": name, "chunk_rows": 4}


def case_list() -> list[dict]:
    cases = [
        {"name": f"global/{policy}", "head": PARALLEL_K4, "reduction": reduction(policy), "schedule": schedule("sequential")}
        for policy in POLICIES
    ]
    cases += [
        {"name": f"local/{policy}", "head": PARALLEL_K4, "reduction": reduction(policy, "local"), "schedule": schedule("sequential")}
        for policy in ("head_mean", "weighted_pair")
    ]
    cases += [
        {"name": f"head/{name}", "head": head, "reduction": reduction("weighted_pair"), "schedule": schedule("sequential")}
        for name, head in EVERY_HEAD.items()
    ]
    cases += [
        {"name": f"validate/odd_rows{suffix}", "head": PARALLEL_K4, "reduction": reduction("head_mean"), "schedule": schedule("sequential"),
         "validate": {**VALIDATION_DATA, **extra}}
        for suffix, extra in (("", {}), ("_streaming", {"streaming": True}))
    ]
    cases += [
        {"name": f"schedule/{name}", "head": DEEPSEEK_D2, "reduction": reduction("head_mean"), "schedule": schedule(name)}
        for name in SCHEDULES
    ]
    cases += [{"name": f"method/{name}", "reduction": reduction("global"), "schedule": schedule("sequential"), **case}
              for name, case in METHOD_CASES.items()]
    return cases


# Issue 17's methods under DDP: horizons 3-4 skipped (λ = 0 for good; `global` coefficients depend on their
# counts, and DDP must see every Parameter used), a frozen trunk (no gradients), a distilled target.
METHOD_CASES = {
    "phased_skip": {"head": PARALLEL_K4, "weights": {"name": "phased", "phases": [[1, 0.5]], "boundaries": None}},
    "frozen_trunk": {"head": {"name": "parallel", "k": 3, "trunk_grad": "frozen"}},
    "distill": {"head": {"name": "parallel", "k": 3}, "objective": {"target": "mix", "mix_alpha": 0.5}},
}


def clean_env() -> dict:
    """No inherited distributed settings: the worker must launch its own rank 1."""
    env = cli_env(OMP_NUM_THREADS="1")
    for key in ("LOCAL_RANK", "RANK", "GLOBAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "PL_GLOBAL_SEED"):
        env.pop(key, None)
    return env


def launch(devices: int, cases_path: Path, out: Path, log: Path) -> tuple[subprocess.Popen, object]:
    handle = open(log, "w")
    cache = out.parent / f"cache-{devices}"  # one per worker: the two run concurrently
    cmd = [sys.executable, str(WORKER), "--devices", str(devices), "--cases", str(cases_path), "--out", str(out), "--cache-dir", str(cache)]
    # Own session: on timeout the whole group (rank 0 and the rank 1 it launched) is killed.
    proc = subprocess.Popen(cmd, cwd=REPO, env=clean_env(), stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, handle


def finish(proc: subprocess.Popen, handle, log: Path, what: str, deadline: float) -> None:
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_session(proc)
        handle.close()
        pytest.fail(f"{what} worker exceeded {SUBPROCESS_TIMEOUT}s; log tail:\n{log.read_text()[-4000:]}")
    handle.close()
    if proc.returncode != 0:
        kill_session(proc)  # a rank left hanging in a collective
        pytest.fail(f"{what} worker exited with {proc.returncode}; log tail:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"single": {case: result}, "ddp": {...}, "ddp_rank1": {...}} from one invocation each."""
    root = tmp_path_factory.mktemp("ddp")
    cases = case_list()
    cases_path = root / "cases.json"
    cases_path.write_text(json.dumps(cases))
    start = time.monotonic()
    deadline = start + SUBPROCESS_TIMEOUT
    ddp = launch(2, cases_path, root / "ddp.pt", root / "ddp.log")
    single = launch(1, cases_path, root / "single.pt", root / "single.log")
    finish(*ddp, root / "ddp.log", "2-process DDP", deadline)
    finish(*single, root / "single.log", "1-process", deadline)
    print(f"\n[test_ddp] workers ({len(cases)} cases each, run concurrently) took {time.monotonic() - start:.1f}s")
    load = lambda path: torch.load(path, weights_only=True)  # noqa: E731
    results = {"single": load(root / "single.pt"), "ddp": load(root / "ddp.pt"), "ddp_rank1": load(root / "ddp.pt.rank1")}
    for key, values in results.items():
        missing = [c["name"] for c in cases if c["name"] not in values]
        assert not missing, f"{key} run has no result for {missing}"
    return results


# ---- comparison helpers -----------------------------------------------------------------


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a-b| / max|b| (absolute difference when b is all zeros)."""
    diff = (a.double() - b.double()).abs().max().item()
    scale = b.double().abs().max().item()
    return diff / scale if scale > 0 else diff


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.double(), b.double()
    return (a - b).abs().max().item() <= RTOL * b.abs().max().item() + ATOL


def mismatches(got: dict, ref: dict) -> list[str]:
    """Human-readable list of what differs between two step results (empty when equal)."""
    problems = []
    if not close(got["loss"], ref["loss"]):
        problems.append(
            f"loss {got['loss'].item():.9g} vs {ref['loss'].item():.9g} (rel {relative(got['loss'], ref['loss']):.3g})"
        )
    if got["grad_none"] != ref["grad_none"]:
        problems.append(f"parameters without gradient differ: {got['grad_none']} vs {ref['grad_none']}")
    if set(got["grads"]) != set(ref["grads"]):
        problems.append(f"parameter names differ: {sorted(set(got['grads']) ^ set(ref['grads']))}")
    bad = []
    for name, ref_grad in ref["grads"].items():
        grad = got["grads"].get(name)
        if grad is None:
            continue
        if grad.shape != ref_grad.shape:
            bad.append((float("inf"), f"{name}: shape {tuple(grad.shape)} vs {tuple(ref_grad.shape)}"))
        elif not close(grad, ref_grad):
            diff = (grad.double() - ref_grad.double()).abs().max().item()
            bad.append((relative(grad, ref_grad), f"{name}: max|diff| {diff:.3g}, max|ref| {ref_grad.abs().max().item():.3g}"))
    bad.sort(key=lambda item: -item[0])
    problems += [f"grad {text} (rel {rel:.3g})" for rel, text in bad[:8]]
    if len(bad) > 8:
        problems.append(f"... and {len(bad) - 8} more parameters")
    return problems


def assert_same_step(got: dict, ref: dict, what: str) -> None:
    problems = mismatches(got, ref)
    assert not problems, f"{what}: {len(problems)} mismatch(es) (tolerance {RTOL:g} x max|ref| + {ATOL:g}):\n  " + "\n  ".join(problems)


def max_grad_relative(got: dict, ref: dict) -> tuple[float, str]:
    return max((relative(got["grads"][name], ref_grad), name) for name, ref_grad in ref["grads"].items())


# ---- the setup is what it claims to be --------------------------------------------------


def training_cases(results: dict) -> dict:
    return {name: result for name, result in results.items() if not name.startswith("validate/")}


def test_runs_are_real_ddp_with_uneven_ranks(runs):
    for name, result in training_cases(runs["ddp"]).items():
        assert result["world_size"] == 2 and result["trainer_world_size"] == 2, f"{name}: DDP run had world size {result['world_size']}"
        assert result["local_rows"] == 2, f"{name}: rank 0 trained on {result['local_rows']} rows, expected 2"
        assert runs["ddp_rank1"][name]["global_rank"] == 1
        assert runs["single"][name]["world_size"] == 1 and runs["single"][name]["local_rows"] == 4
        for run in ("ddp", "single"):
            result = runs[run][name]
            assert close(result["logged_loss"], result["loss"]), (
                f"{run} {name}: logged train/objective {result['logged_loss'].item()} != returned loss {result['loss'].item()}"
            )
    for name in ("global/head_mean", "schedule/joint"):
        rank0 = runs["ddp"][name]["local_counts"].double()
        rank1 = runs["ddp_rank1"][name]["local_counts"].double()
        total = runs["single"][name]["local_counts"].double()
        assert torch.equal(rank0 + rank1, total), f"{name}: rank counts {rank0.tolist()} + {rank1.tolist()} != {total.tolist()}"
        assert torch.equal(runs["ddp"][name]["counts"].double(), total), f"{name}: all-reduced counts are not the global counts"
        assert bool((rank0 != rank1).all()) and bool((rank1 > 0).all()), (
            f"{name}: ranks must hold uneven, non-zero counts per horizon, got {rank0.tolist()} vs {rank1.tolist()}"
        )
        shares = rank0 / total
        assert shares.max() - shares.min() > 0.05, f"{name}: rank-0 share per horizon is nearly constant {shares.tolist()}"


def test_ranks_hold_identical_averaged_gradients(runs):
    for name, rank0 in training_cases(runs["ddp"]).items():
        rank1 = runs["ddp_rank1"][name]
        assert torch.equal(rank0["loss"], rank1["loss"]), f"{name}: ranks report different losses"
        differing = [p for p, g in rank0["grads"].items() if not torch.equal(g, rank1["grads"][p])]
        assert not differing, f"{name}: DDP left different gradients on the two ranks for {differing[:5]}"


# ---- 1. every policy is exact under DDP with global counts -------------------------------


@pytest.mark.parametrize("policy", list(POLICIES))
def test_global_count_scope_matches_single_process(runs, policy):
    name = f"global/{policy}"
    assert_same_step(runs["ddp"][name], runs["single"][name], f"policy {policy!r}, count_scope=global, 2-process DDP vs 1 process")


# ---- 2. local counts change the objective ------------------------------------------------


def test_local_count_scope_head_mean_differs(runs, record_property):
    ddp, ref = runs["ddp"]["local/head_mean"], runs["single"]["global/head_mean"]
    # In one process the two scopes coincide; only the DDP run may differ.
    assert_same_step(runs["single"]["local/head_mean"], ref, "1-process head_mean, local vs global scope")
    loss_rel = relative(ddp["loss"], ref["loss"])
    grad_rel, grad_name = max_grad_relative(ddp, ref)
    summary = (
        f"head_mean count_scope=local on 2 ranks vs the global objective: loss {ddp['loss'].item():.6f} vs "
        f"{ref['loss'].item():.6f} (rel diff {loss_rel:.3e}); max grad rel diff {grad_rel:.3e} ({grad_name})"
    )
    print(f"\n[test_ddp] {summary}")
    record_property("local_vs_global_head_mean_loss_rel", loss_rel)
    record_property("local_vs_global_head_mean_grad_rel", grad_rel)
    assert loss_rel > 1e-4 and grad_rel > 1e-4, f"local scope should differ from the global objective by > 1e-4 relative: {summary}"


# ---- 3. backward schedules agree under DDP ------------------------------------------------


@pytest.mark.parametrize("name", SCHEDULES)
def test_backward_schedules_agree_under_ddp(runs, name):
    got = runs["ddp"][f"schedule/{name}"]
    assert_same_step(got, runs["ddp"]["schedule/joint"], f"DeepSeek depth 2, head_mean: DDP {name} vs DDP joint")
    assert_same_step(got, runs["single"][f"schedule/{name}"], f"DeepSeek depth 2, head_mean: DDP {name} vs 1-process {name}")
    assert_same_step(got, runs["single"]["schedule/joint"], f"DeepSeek depth 2, head_mean: DDP {name} vs 1-process joint")


# ---- 4. logged per-horizon metrics equal the 1-process run's ------------------------------


def horizon_metric_mismatches(got: dict, ref: dict, k: int, names=PER_HORIZON) -> list[str]:
    problems = []
    for metric in names:
        for h in range(1, k + 1):
            key = f"train/{metric}/h{h}"
            if key not in ref:
                problems.append(f"{key} missing in the 1-process run")
            elif key not in got:
                problems.append(f"{key} not logged")
            elif not close(got[key], ref[key]):
                problems.append(f"{key}: {got[key].item():.9g} vs {ref[key].item():.9g}")
    return problems


@pytest.mark.parametrize(
    "name",
    [f"global/{p}" for p in POLICIES] + [f"head/{h}" for h in EVERY_HEAD] + ["schedule/joint", "schedule/sequential"],
)
def test_logged_per_horizon_metrics_match_single_process(runs, name):
    ref = runs["single"][name]["horizon_metrics"]
    k = runs["single"][name]["lambdas"].numel()
    for rank in ("ddp", "ddp_rank1"):
        problems = horizon_metric_mismatches(runs[rank][name]["horizon_metrics"], ref, k)
        assert not problems, f"{name} ({rank}): logged per-horizon metrics differ from 1 process:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("policy", ["head_mean", "weighted_pair"])
def test_local_count_scope_logs_global_batch_statistics(runs, policy):
    """Loss, accuracy and count per horizon describe the global batch under either count scope."""
    name = f"local/{policy}"
    got, ref = runs["ddp"][name], runs["single"][name]
    k = ref["lambdas"].numel()
    problems = horizon_metric_mismatches(got["horizon_metrics"], ref["horizon_metrics"], k, ("loss", "acc", "count"))
    assert not problems, f"{name}: logged per-horizon metrics differ from 1 process:\n  " + "\n  ".join(problems)
    # weight_eff = Σ_r c_k^r N_k^r / Σ_r Σ_j c_j^r N_j^r with each rank's own coefficients.
    lam = got["lambdas"].double()
    masses = []
    for rank in ("ddp", "ddp_rank1"):
        n = runs[rank][name]["local_counts"].double()
        c = lam / n if policy == "head_mean" else lam / (lam * n).sum()
        masses.append(c * n)
    expected = (masses[0] + masses[1]) / (masses[0] + masses[1]).sum()
    logged = torch.stack([got["horizon_metrics"][f"train/weight_eff/h{h}"] for h in range(1, k + 1)])
    assert close(logged, expected), f"{name}: weight_eff {logged.tolist()} vs hand-computed {expected.tolist()}"
    if policy == "head_mean":  # each rank's mass is λ_k: the same shares as one process
        single = torch.stack([ref["horizon_metrics"][f"train/weight_eff/h{h}"] for h in range(1, k + 1)])
        assert close(logged, single)


# ---- 5. validation counts every row once ---------------------------------------------------


@pytest.mark.parametrize("name", ["validate/odd_rows", "validate/odd_rows_streaming"])
def test_validation_with_rows_not_divisible_by_ranks_counts_each_row_once(runs, name):
    ddp, rank1, single = runs["ddp"][name], runs["ddp_rank1"][name], runs["single"][name]
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    assert single["val_rows_this_rank"] == VAL_ROWS
    assert (ddp["val_rows_this_rank"], rank1["val_rows_this_rank"]) == (3, 2), "each row once: rows 0, 2, 4 and 1, 3"
    for key, ref in single["val"].items():
        assert key in ddp["val"], f"{key} not logged under DDP"
        same = close(ddp["val"][key], ref) or (ddp["val"][key].isnan() and ref.isnan())  # chain_acc: NaN with no correct prefix
        assert same, f"{key}: DDP {ddp['val'][key].item():.9g} vs 1 process {ref.item():.9g}"
    assert "val/bpb" in single["val"] and "val/loss/h4" in single["val"]
    counts = [key for key in single["val"] if key.startswith("val/count/")]
    assert counts and all(torch.equal(ddp["val"][key], single["val"][key]) for key in counts)


# ---- 6. issue 17's methods are exact under DDP ---------------------------------------------


@pytest.mark.parametrize("name", list(METHOD_CASES))
def test_new_methods_match_single_process(runs, name):
    assert_same_step(runs["ddp"][f"method/{name}"], runs["single"][f"method/{name}"], f"{name}: 2-process DDP vs 1 process")
    if name == "frozen_trunk":
        none = runs["ddp"]["method/frozen_trunk"]["grad_none"]
        assert none and all(p.startswith("trunk.") for p in none)
