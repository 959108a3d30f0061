"""The machine a run happened on: device, driver, versions, git commit; and the interpreter switch.

Used by ``fuselab env``, by the bench JSON header, and by the default output directory
(``benchmarks/results/<device slug>``).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


def has_cuda() -> bool:
    return torch.cuda.is_available()


def enable_interpreter_if_no_cuda() -> bool:
    """Set ``TRITON_INTERPRET=1`` when no CUDA device is present and Triton is not imported yet.

    Returns whether Triton kernels can run on this machine (a GPU, or the interpreter on).
    The CLI calls this at start-up; the interpreter must be chosen before ``import triton``.
    """
    if has_cuda():
        return True
    if "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_mode() -> str:
    """``gpu``, ``interpreter`` or ``unavailable`` (no GPU and the interpreter not enabled)."""
    if has_cuda():
        return "gpu"
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "interpreter"
    return "unavailable"


def device_slug(name: str | None = None) -> str:
    """Short name of the device for result folders: ``h100``, ``h200``, ``a100``, ... or ``cpu``."""
    if name is None:
        if not has_cuda():
            return "cpu"
        name = torch.cuda.get_device_name()
    match = re.search(r"\b([a-z]{1,3}\d{2,4}[a-z]?)\b", name.lower().replace("nvidia", ""))
    if match:
        return match.group(1)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def driver_version() -> str | None:
    """The NVIDIA driver version from ``nvidia-smi`` (None without one)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    """The current commit of the repository at ``cwd`` (with ``+dirty`` if it has changes), or None."""
    cwd = Path(cwd or Path.cwd())
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def environment(device: torch.device | str | None = None) -> dict[str, Any]:
    """Everything the JSON header and ``fuselab env`` report (no measurement), for the run's ``device`` (default:
    CUDA when present, else the CPU; a CPU run on a GPU machine reports the CPU)."""
    cuda = has_cuda() and (device is None or torch.device(device).type == "cuda")
    info: dict[str, Any] = {
        "device_type": "cuda" if cuda else "cpu",
        "device": torch.cuda.get_device_name() if cuda else cpu_name(),
        "device_slug": device_slug() if cuda else "cpu",
        "cpu_threads": torch.get_num_threads(),
        "driver": driver_version() if cuda else None,
        "cuda_runtime": torch.version.cuda,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "triton_mode": triton_mode(),
        "fuselab_backend": os.environ.get("FUSELAB_BACKEND", "auto"),
        "git_commit": git_commit(),
    }
    if cuda:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["sm_count"] = props.multi_processor_count
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
        info["l2_cache_mib"] = round(getattr(props, "L2_cache_size", 0) / 2**20, 1)
        info["capability"] = f"{props.major}.{props.minor}"
    return info
