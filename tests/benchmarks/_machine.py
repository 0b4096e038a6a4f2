"""What the benchmark ran on: CPU, cores, memory, OS, Python and the versions of the packages measured."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

PACKAGES = ("openenv-anyio", "websockets", "httpx", "uvicorn", "hypercorn", "starlette", "msgspec", "anyio", "trio")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe(reference_versions: dict[str, str]) -> dict[str, object]:
    """This machine and the packages on both sides (``reference_versions``: those of the reference's venv)."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(_memory_gib(), 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "reference_packages": reference_versions,
        "load_average": os.getloadavg(),
    }
