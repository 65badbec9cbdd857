"""Shared benchmark helpers: timing medians, machine description, table output."""

from __future__ import annotations

import datetime
import platform
import statistics
import time

import torch


def median_seconds(fn, repeats: int = 5, warmup: int = 1, sync=None) -> float:
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine_line() -> str:
    import virtual_noise as vn

    info = vn.build_info()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{datetime.date.today()} | {cpu}, {torch.get_num_threads()} threads | torch {torch.__version__} | "
            f"python {platform.python_version()} | virtual_noise {vn.__version__} (simd {info['simd']})")


def markdown_table(headers: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
