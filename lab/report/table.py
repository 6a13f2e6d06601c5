"""runs.csv, sweep dimensions, variants (jobs that differ only by seed) and mean ± spread."""

from __future__ import annotations

import csv
import io
import math
import re
import statistics
from dataclasses import dataclass, field

from lab.report.head_traits import HeadTraits, traits_of
from lab.report.records import RECORD_FIELDS, ReportError, finite, override_items

SEED_KEYS = ("seed", "+seed", "++seed")
HORIZON_METRIC = re.compile(r"^(?P<base>.+)/h(?P<k>\d+)$")
BASE_COLUMNS = ("job", "run_dir", "overrides", "status", "error", "run_time_s", *RECORD_FIELDS, "steps_logged")
# From run.json `cost` (lab/model/cost.py and the TokenThroughput callback's measured totals, CPU time and contention).
COST_COLUMNS = (
    "params_total", "blocks_trunk", "blocks_head", "blocks_next_token_path", "train_flops_per_token",
    "train_tokens_per_s", "train_time_s", "train_tokens_per_cpu_s", "train_thread_cpu_s", "train_process_cpu_s", "train_cpu_share",
    "train_threads", "train_cores", "train_load_start", "train_load_end", "train_contended",
)


def metric_sort_key(name: str):
    """Group per-horizon metrics together and order them by horizon (h2 before h10)."""
    match = HORIZON_METRIC.match(name)
    if match:
        return (match.group("base"), 1, int(match.group("k")), name)
    return (name, 0, 0, name)


def steps_done(record: dict) -> int | None:
    """Optimizer steps the job trained: run.json's count when recorded, else from the history (a validation's step
    is the step count it ran at; a training value's step is its batch index, one less than the count after it)."""
    if isinstance(record.get("steps"), int):
        return record["steps"]
    history = record["history"]
    validated = [series[-1][0] for name, series in history.items() if series and name.startswith("val/")]
    trained = [series[-1][0] + 1 for name, series in history.items() if series and name.startswith("train/loss")]
    return max(validated + trained) if validated or trained else None


def metric_columns(records: list[dict]) -> list[str]:
    names = set()
    for record in records:
        names |= set(record["final"])
    return sorted(names, key=metric_sort_key)


def format_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


GRAD_COSINE_PREFIX = "grad/cos/"
OVER_STEPS = "/mean_over_steps"  # runs.csv's gradient-cosine summary: the mean over every logged step of the run


def grad_cosine_summary(record: dict) -> dict[str, float]:
    """{grad/cos/…/mean_over_steps: mean} of every gradient cosine the run logged (DiagnosticsCallbacks)."""
    out = {}
    for name, series in record["history"].items():
        values = [v for _, v in series if finite(v)]
        if name.startswith(GRAD_COSINE_PREFIX) and values:
            out[name + OVER_STEPS] = statistics.fmean(values)
    return out


def runs_csv_text(records: list[dict]) -> str:
    """One row per job (failed ones included): overrides, status, reason, final and per-horizon metrics, run time,
    and each gradient cosine's mean over the run's steps."""
    metrics = metric_columns(records)
    summaries = [grad_cosine_summary(record) for record in records]
    cosines = sorted({name for summary in summaries for name in summary}, key=metric_sort_key)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*BASE_COLUMNS, *COST_COLUMNS, *metrics, *cosines])
    for record, summary in zip(records, summaries):
        row = [
            record["job"], record["run_dir"], " ".join(record["overrides"]), record["status"], record["error"],
            None if record["run_time_s"] is None else round(record["run_time_s"], 3),
            *(record.get(name) for name in RECORD_FIELDS), steps_done(record),
            *(record.get("cost", {}).get(name) for name in COST_COLUMNS),
        ]
        row += [record["final"].get(name) for name in metrics]
        row += [summary.get(name) for name in cosines]
        writer.writerow([format_cell(cell) for cell in row])
    return buffer.getvalue()


HISTORY_COLUMNS = ("job", "variant", "seed", "overrides", "step", "metric", "value")


def history_csv_text(records: list[dict]) -> str:
    """history.csv: every logged value of every job in long format (one row per job, step and metric), for users'
    own plots; `variant` is the report's label, so `groupby(["variant", "step", "metric"])` averages over seeds."""
    dims = sweep_dimensions(records)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(HISTORY_COLUMNS)
    for record in records:
        identity = [record["job"], variant_label(record, dims), record.get("seed"), " ".join(record["overrides"])]
        for metric in sorted(record["history"], key=metric_sort_key):
            for step, value in record["history"][metric]:
                writer.writerow([format_cell(cell) for cell in (*identity, step, metric, value)])
    return buffer.getvalue()


# ---- dimensions and variants --------------------------------------------------------------


def sweep_dimensions(records: list[dict]) -> list[str]:
    """Override keys whose value differs between jobs (in first-seen order)."""
    seen: dict[str, set] = {}
    order: list[str] = []
    for record in records:
        for key, value in override_items(record["overrides"]):
            if key not in seen:
                seen[key] = set()
                order.append(key)
            seen[key].add(value)
    missing = {key for key in order if any(key not in dict(override_items(r["overrides"])) for r in records)}
    return [key for key in order if len(seen[key]) > 1 or key in missing]


def variant_label(record: dict, dims: list[str]) -> str:
    values = dict(override_items(record["overrides"]))
    parts = [f"{key}={values[key]}" for key in dims if key not in SEED_KEYS and key in values]
    if parts:
        return " ".join(parts)
    head = record.get("head") or "run"
    return f"{head}-k{record['k']}" if record.get("k") is not None else head


@dataclass
class Variant:
    label: str
    records: list[dict] = field(default_factory=list)
    chosen_baseline: bool | None = None  # set by `choose_baseline`: True/False overrides the head's own trait

    @property
    def ok(self) -> list[dict]:
        return [r for r in self.records if r["status"] == "ok"]

    @property
    def first(self) -> dict:
        return (self.ok or self.records)[0]

    @property
    def head(self):
        return self.first.get("head")

    @property
    def k(self):
        return self.first.get("k")

    @property
    def traits(self) -> HeadTraits:
        return traits_of(self.first)

    @property
    def is_baseline(self) -> bool:
        """The variant differences are taken to: `report.baseline` when set, else a head whose trait says so (ntp)."""
        return self.traits.baseline if self.chosen_baseline is None else self.chosen_baseline

    @property
    def teacher_forced(self) -> bool:
        return self.traits.teacher_forced

    @property
    def display_rank(self) -> int:
        return self.traits.display_rank

    def cost(self, name: str) -> float | None:
        """Mean of one run.json `cost` entry over the variant's completed jobs (None when no job has it)."""
        values = [r["cost"][name] for r in self.ok if finite(r.get("cost", {}).get(name))]
        return mean_spread(values)[0]

    def values(self, metric: str) -> list[float]:
        return [r["final"][metric] for r in self.ok if finite(r["final"].get(metric))]

    def stat(self, metric: str) -> tuple[float | None, float | None, int]:
        """(mean, spread, n): spread is the sample standard deviation over seeds (0 for one seed)."""
        return mean_spread(self.values(metric))

    def cell(self, metric: str, digits: int = 4) -> str:
        mean, spread, n = self.stat(metric)
        if mean is None:
            return "—"
        if n > 1:
            return f"{mean:.{digits}f} ± {spread:.{digits}f}"
        return f"{mean:.{digits}f}"

    @property
    def max_k(self) -> int:
        return max((r.get("k") or 1 for r in self.ok), default=self.k or 1)


def mean_spread(values: list[float]) -> tuple[float | None, float | None, int]:
    if not values:
        return None, None, 0
    mean = statistics.fmean(values)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, spread, len(values)


def variants(records: list[dict], baseline: str | None = None, field: str = "report.baseline") -> list[Variant]:
    """Jobs grouped by every sweep dimension except the seed, in job order; `baseline`: see `choose_baseline`."""
    dims = sweep_dimensions(records)
    groups: dict[str, Variant] = {}
    for record in records:
        label = variant_label(record, dims)
        groups.setdefault(label, Variant(label)).records.append(record)
    return choose_baseline(list(groups.values()), baseline, field)


def choose_baseline(groups: list[Variant], baseline: str | None, field: str = "report.baseline") -> list[Variant]:
    """`baseline` (a variant label, e.g. `head=ntp`) becomes the only baseline; None keeps the heads' own trait
    (ntp), so a sweep without such a variant has no baseline and its report states no differences."""
    if baseline is None:
        return groups
    labels = [v.label for v in groups]
    if baseline not in labels:
        raise ReportError(f"{field}: '{baseline}' is not a variant of this sweep; allowed: {', '.join(labels)}")
    for variant in groups:
        variant.chosen_baseline = variant.label == baseline
    return groups


def baseline_of(groups: list[Variant]) -> Variant | None:
    """The one variant differences are taken to (None: the sweep has none, or several, e.g. one ntp per model size)."""
    found = [v for v in groups if v.is_baseline and v.ok]
    return found[0] if len(found) == 1 else None


EMPTY_CELLS = ("", "—")


def drop_empty_columns(header: list[str], rows: list[list[str]], keep: int = 1) -> tuple[list[str], list[list[str]], list[int]]:
    """The table without the columns that hold no value in any row (blank or '—', e.g. a failure reason when no job
    failed); the first `keep` columns (the labels) always stay. Returns (header, rows, the kept column indexes)."""
    kept = [i for i in range(len(header)) if i < keep or any(str(row[i]).strip() not in EMPTY_CELLS for row in rows)]
    if not rows:
        kept = list(range(len(header)))
    return [header[i] for i in kept], [[row[i] for i in kept] for row in rows], kept


def seed_count(records: list[dict]) -> int:
    seeds = {dict(override_items(r["overrides"])).get(key) for r in records for key in SEED_KEYS}
    seeds.discard(None)
    return max(1, len(seeds))


def order_key(variant: Variant):
    """Tables and figures list variants in the heads' display order (run.json `head_traits`), then by K."""
    return (variant.display_rank, variant.k or 0)
