"""Board power, SM clock and power capping while each forward row of bench_cuda.py runs.

    python benchmarks/power_cuda.py [--out DIR] [--seconds 3]

Runs each workload back to back for a few seconds while `nvidia-smi` samples the
GPU every 50 ms, and prints a markdown table of the medians (writes
power_cuda.{md,json}). The workloads are the tf32 reference GEMM, the splitmix64
generation roof and bench_cuda.py's forward rows, plain and antithetic. It
tells whether a row is held back by the board's power limit (the driver's
software power cap lowers the SM clock) or runs at full clock, where its
speed is set by the kernel alone. The host synchronizes every 10 calls to
keep each window's end sharp, so "ms per call" reads a little above
bench_cuda.py's steady-state time: take speeds from bench_cuda.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from bench_cuda import FORWARD, forward_call, forward_inputs, roof_call, tf32_gemm  # noqa: E402
from common import machine_line, markdown_table  # noqa: E402

FIELDS = "power.draw,clocks.sm,temperature.gpu"
CAP_FIELDS = ("clocks_event_reasons.sw_power_cap", "clocks_throttle_reasons.sw_power_cap")  # new name, old name
SAMPLE_MS = 50
RAMP_S = 1.0  # samples of each window's first second are dropped: power and clock are still settling


def smi(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True)


def cap_field() -> str:
    """The power-cap reason's query name: drivers renamed clocks_throttle_reasons to clocks_event_reasons."""
    for f in CAP_FIELDS:
        if smi(f"--query-gpu={f}", "--format=csv,noheader").returncode == 0:
            return f
    raise RuntimeError("nvidia-smi reports no software power-cap reason")


def parse_samples(text: str) -> list[tuple[float, float, float, bool]]:
    """(watts, SM MHz, degrees C, power cap active) per line of `--format=csv,noheader,nounits` output."""
    out = []
    for line in text.splitlines():
        p = [v.strip() for v in line.split(",")]
        try:
            out.append((float(p[0]), float(p[1]), float(p[2]), p[3] == "Active"))
        except (IndexError, ValueError):
            continue  # a partial line at the sampler's end, or "[N/A]"
    return out


def sample_while(fn, seconds: float, cap: str, index: int):
    """Run fn back to back for `seconds` while nvidia-smi samples; (ms per call, samples after the ramp)."""
    for _ in range(3):
        fn()  # compile and warm up outside the window
    torch.cuda.synchronize()
    sampler = subprocess.Popen(["nvidia-smi", "-i", str(index), f"--query-gpu={FIELDS},{cap}",
                                "--format=csv,noheader,nounits", "-lms", str(SAMPLE_MS)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    start = time.perf_counter()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    calls = 0
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()  # keeps the host's queue short, so the window ends when the time is up
    b.record()
    torch.cuda.synchronize()
    sampler.terminate()
    samples = parse_samples(sampler.communicate()[0])
    keep = int(RAMP_S * 1e3 / SAMPLE_MS)
    return a.elapsed_time(b) / calls, samples[keep:] or samples  # a short window keeps all it has


def workloads():
    """(name, fn, units per call, unit): the reference GEMM, the roof, and the forward rows (bench_cuda.py's)."""
    gemm, flops = tf32_gemm()
    yield "tf32 GEMM 8192^3 (cuBLAS)", gemm, flops / 1e12, "TFLOP/s"
    roof, elements = roof_call()
    yield "splitmix64 roof", roof, elements / 1e9, "G el/s"
    g = torch.Generator(device="cuda").manual_seed(0)
    for P, B, i, o, per in FORWARD:
        x, w, b, shape = forward_inputs(P, B, i, o, per, g)
        for anti in (False, True):
            name = f"forward{' antithetic' if anti else ''} {shape}"
            yield name, forward_call(x, w, b, P, anti), P * o * i / 1e9, "G el/s"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    torch.set_float32_matmul_precision("high")
    index = torch.cuda.current_device()
    cap = cap_field()
    limit = smi("-i", str(index), "--query-gpu=power.limit,clocks.max.sm", "--format=csv,noheader").stdout.strip()
    time.sleep(2.0)
    idle = parse_samples(smi("-i", str(index), f"--query-gpu={FIELDS},{cap}", "--format=csv,noheader,nounits").stdout)
    rows, records = [], []
    for name, fn, units, unit in workloads():
        ms, s = sample_while(fn, args.seconds, cap, index)
        if not s:
            raise RuntimeError(f"nvidia-smi gave no samples while {name} ran")
        rec = dict(workload=name, ms=ms, rate=units / (ms / 1e3), unit=unit, samples=len(s),
                   watts=statistics.median(v[0] for v in s), sm_mhz=statistics.median(v[1] for v in s),
                   celsius=statistics.median(v[2] for v in s), power_capped=sum(v[3] for v in s) / len(s))
        records.append(rec)
        rows.append([name, f"{ms:.3f}", f"{rec['rate']:.0f} {unit}", f"{rec['watts']:.0f}", f"{rec['sm_mhz']:.0f}",
                     f"{rec['power_capped']:.0%}", f"{rec['celsius']:.0f}"])
        time.sleep(1.0)  # back towards idle between windows
    head = [machine_line(),
            f"GPU: {torch.cuda.get_device_name()} | triton {triton.__version__} | power limit, max SM clock: {limit}"
            + (f" | idle {idle[0][0]:.0f} W at {idle[0][1]:.0f} MHz" if idle else "")]
    table = markdown_table(["workload", "ms per call", "rate", "board W", "SM MHz", "power-capped samples", "deg C"],
                           rows)
    text = "\n".join(head) + "\n\n" + table
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "power_cuda.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "power_cuda.json"), "w") as f:
        json.dump({"head": head, "rows": records}, f, indent=1)


if __name__ == "__main__":
    main()
