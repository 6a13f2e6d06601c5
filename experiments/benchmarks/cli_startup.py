"""How long `lab-train --help` (and so tab completion) takes, against Python's own start-up and
against importing Lightning (what the help cost while `lab.train` imported it eagerly).

Each variant is a fresh interpreter (subprocess), timed interleaved round-robin. Goal: the
median `lab-train --help` under 1.5 s.

    python -m experiments.benchmarks.cli_startup            # 7 rounds
    python -m experiments.benchmarks.cli_startup --quick    # 2 rounds (smoke)
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from experiments.benchmarks.common import interleave, paired_ratio, table, verdict

GOAL_S = 1.5


def command(*args: str):
    def run() -> None:
        result = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {result.stderr[-500:]}")

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else args.repeats
    timings = interleave({
        "lab-train --help": command("-m", "lab.train", "--help"),
        "python -c pass": command("-c", "pass"),
        "import pytorch_lightning": command("-c", "import pytorch_lightning"),
    }, repeats=repeats, warmup=1)
    help_t, bare, lightning = timings["lab-train --help"], timings["python -c pass"], timings["import pytorch_lightning"]
    print(table(["variant", "median s [IQR]"], [[name, t.describe()] for name, t in timings.items()]))
    print(f"paired help / import pytorch_lightning: {paired_ratio(help_t, lightning).describe()}")
    print(f"paired help / python -c pass: {paired_ratio(help_t, bare).describe()}")
    print(f"goal: lab-train --help median <= {GOAL_S} s: {help_t.median:.2f} s {verdict(help_t.median <= GOAL_S)}")


if __name__ == "__main__":
    main()
