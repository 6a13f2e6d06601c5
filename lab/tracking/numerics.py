"""The numerics fingerprint of a run: what decides its digits besides its config.

The same config gives other digits on another CPU kind (AVX2, AVX-512, AMX kernels split and fuse reductions
differently), with another thread count, another torch / MKL / oneDNN build, or another dtype. run.json keeps
them under `numerics`; the report notes when jobs compared in one table differ in any of them (lab/report/noise.py).

    cpu           the CPU's model name (/proc/cpuinfo)
    isa           the kernel-deciding ISA flags the CPU has: avx2, avx512f, avx512_bf16, amx_tile, amx_bf16
    capability    the CPU kernels torch dispatches to (torch.backends.cpu.get_cpu_capability(); ATEN_CPU_CAPABILITY lowers it)
    env           ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA when set (they select other kernels on the same CPU)
    torch, mkl, onednn   library versions (from torch.__config__.show())
    threads       intra-op threads; dtype: the parameters' dtype; precision: the Trainer's precision
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
COMPARED = ("cpu", "isa", "capability", "env", "torch", "mkl", "onednn", "threads", "dtype", "precision")


def cpu_info() -> tuple[str, list[str]]:
    """(model name, the ISA_FLAGS this CPU has) from /proc/cpuinfo; the platform's processor string elsewhere."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return platform.processor() or platform.machine(), []
    name = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.+)$", text, re.M) or [None, ""])[1].split())
    return (name.group(1).strip() if name else platform.machine()), [flag for flag in ISA_FLAGS if flag in flags]


def library_versions() -> dict[str, str | None]:
    import torch

    shown = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version (\S+)", shown)
    onednn = re.search(r"MKL-DNN v(\S+)", shown)
    return {"torch": torch.__version__, "mkl": mkl.group(1) if mkl else None, "onednn": onednn.group(1) if onednn else None}


def numerics_fingerprint(threads: int, dtype: str, precision: str) -> dict:
    import torch

    cpu, isa = cpu_info()
    return {"cpu": cpu, "isa": isa, "capability": torch.backends.cpu.get_cpu_capability(),
            "env": {name: os.environ[name] for name in KERNEL_ENV if name in os.environ},
            **library_versions(), "threads": int(threads), "dtype": dtype, "precision": str(precision)}


def fingerprint_label(fingerprint: dict) -> str:
    """One short line: `AMD EPYC · AVX512 · torch 2.13.0 · 1 thread · float32`."""
    if not fingerprint:
        return "not recorded"
    env = "".join(f" {name}={value}" for name, value in (fingerprint.get("env") or {}).items())
    threads = fingerprint.get("threads")
    return (f"{fingerprint.get('cpu')} · {fingerprint.get('capability')}{env} · torch {fingerprint.get('torch')} · "
            f"{threads} thread{'s' if threads != 1 else ''} · {fingerprint.get('dtype')} · {fingerprint.get('precision')}")


def differing_fields(fingerprints: list[dict]) -> list[str]:
    """The COMPARED fields whose values differ across `fingerprints` (recorded ones only)."""
    recorded = [f for f in fingerprints if f]
    return [name for name in COMPARED if len({repr(f.get(name)) for f in recorded}) > 1]


def code_version(folder: Path) -> str:
    """The git commit checked out at `folder`, marked when the code differs from it (a record names its code; edits to
    tests, docs and records compute nothing and are not counted)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=folder).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!tests", ":!docs", ":!results", ":!*.md") else "")
