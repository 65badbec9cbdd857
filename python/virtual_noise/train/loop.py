"""The training loop of the main job: progress bar, metrics as the run goes, rolling checkpoints,
clean interrupts, exact resume; at the end the model, the curve and a summary.

A run writes ``checkpoint-GGGGGGGG.pt`` (the last ``keep`` of them; es/checkpoint.py) every
``checkpoint_every`` generations or ``checkpoint_minutes`` minutes, whichever comes first, and
at the end; ``metrics.csv`` gets one row per generation as it completes. SIGINT / SIGTERM
finish the generation in progress, write a checkpoint and stop with RunInterrupted; a second
SIGINT exits at once. ``resume=True`` continues from the newest checkpoint that loads, with the
task's random state, the metrics and the seed generator restored, so the run continues bit for
bit as if never stopped.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import sys
import time

import torch

from ..es import ES
from ..es.checkpoint import Checkpointer, CheckpointError

#: Options whose change would change the run: resuming with another value is refused.
RUN_OPTIONS = ("task", "model", "hidden", "population", "sigma", "lr", "antithetic", "shaping", "weight_decay",
               "noise", "rank", "seed", "batch", "lr_schedule", "nonfinite_fitness")


class RunError(Exception):
    """A run cannot start or continue (the message is one line for the CLI)."""


class RunInterrupted(Exception):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def learning_rate(base: float, schedule: str, generation: int, generations: int) -> float:
    """The learning rate of a generation: constant, or cosine from base to 0 over the run."""
    if schedule == "cosine":
        return base * 0.5 * (1 + math.cos(math.pi * min(generation, generations) / generations))
    return base


class _StopRequests:
    """SIGINT / SIGTERM set a flag the loop reads between generations; a second SIGINT exits at once."""

    def __init__(self):
        self.signal = None

    def __enter__(self):
        import threading

        self.previous = {}
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def _handle(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            sys.stderr.write("virtual-noise train: second interrupt: stopping now; the last checkpoint is kept\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.signal = signum


def _check_options(saved: dict, options: dict, generations: int, path: str) -> None:
    for key in RUN_OPTIONS:
        if key in saved and saved[key] != options.get(key):
            flag = "--" + key.replace("_", "-")
            raise RunError(f"cannot resume from {path}: it was run with {flag} {saved[key]}, not {options.get(key)} "
                           f"(that would change the run; use another --out for a new one)")
    if options.get("lr_schedule") == "cosine" and saved.get("generations") != generations:
        raise RunError(f"cannot resume from {path}: it was run with --generations {saved.get('generations')} and a "
                       f"cosine learning rate over them; another --generations would change the schedule")


def train(task, es: ES, *, generations: int, out_dir: str, eval_every: int = 10, time_limit: float | None = None,
          progress: bool = True, resume: bool = False, lr_schedule: str = "constant", options: dict | None = None,
          checkpoint_every: int = 50, checkpoint_minutes: float | None = 10.0, keep_checkpoints: int = 2,
          resume_command: str = "") -> dict:
    from tqdm import tqdm

    options = dict(options or {}, generations=generations)
    lead = es.rank == 0  # with several ranks, rank 0 reports and writes files
    progress = progress and lead
    if lead:
        os.makedirs(out_dir, exist_ok=True)
    ckpts = Checkpointer(out_dir, every=checkpoint_every, minutes=checkpoint_minutes, keep=keep_checkpoints)
    metrics_path = os.path.join(out_dir, "metrics.csv")
    rows: list[dict] = []
    if resume:
        try:
            path, ckpt, skipped = ckpts.newest()
            _check_options(ckpt["extra"].get("options", {}), options, generations, path)
            for line in skipped:
                print(f"virtual-noise train: skipping {line}", file=sys.stderr)
            es.load_state_dict(ckpt["es"])
            extra = ckpt["extra"]
        except (CheckpointError, ValueError) as e:
            raise RunError(str(e)) from None
        task.generator.set_state(extra["task_generator"])
        rows = extra["metrics"]
    if lead:  # the history up to the checkpoint; rows written after it (before a crash) are dropped
        write_csv(rows, metrics_path)
    start = time.perf_counter()
    elapsed0 = rows[-1]["seconds"] if rows else 0.0
    metric = rows[-1][task.metric_name] if rows else float("nan")
    bar = tqdm(total=generations, initial=es.generation, desc=task.name, disable=not progress, unit="gen")
    stop_reason = "generations"
    base_lrs = [g["lr"] for g in es.optimizer.param_groups]

    def extra():
        return {"task_generator": task.generator.get_state(), "metrics": rows, "options": options}

    with _StopRequests() as stops:
        while es.generation < generations:
            for g, base in zip(es.optimizer.param_groups, base_lrs):
                g["lr"] = learning_rate(base, lr_schedule, es.generation, generations)
            es.ask()
            fitness = task.fitness(es)
            stats = es.tell(fitness)
            seconds = elapsed0 + time.perf_counter() - start
            last = es.generation == generations or (time_limit is not None and seconds >= time_limit)
            if es.generation % eval_every == 0 or last:
                metric = task.evaluate(es.module)
            row = {"generation": es.generation, "seconds": round(seconds, 4), "fitness_mean": stats["mean"],
                   "fitness_max": stats["max"], task.metric_name: metric, "nonfinite": stats["nonfinite"],
                   "comm_bytes": 0 if es.shard is None else es.shard.bytes_last_generation}
            rows.append(row)
            if lead:
                append_csv(row, metrics_path)
            bar.update(1)
            bar.set_postfix({"fit": f"{stats['mean']:.3f}", task.metric_name: f"{metric:.3f}"})
            if _stop_requested(es, stops.signal):
                path = ckpts.save(es, **extra())
                bar.close()
                name = signal.Signals(stops.signal).name if stops.signal else "a signal on another rank"
                raise RunInterrupted(f"stopped by {name} after generation {es.generation}; checkpoint {path}; "
                                     f"continue with: {resume_command}", 128 + (stops.signal or signal.SIGTERM))
            if getattr(task, "stop_at_target", False) and metric >= task.target:
                stop_reason = "target reached"
                break
            if time_limit is not None and seconds >= time_limit:
                stop_reason = "time limit"
                break
            ckpts.maybe_save(es, **extra())
    bar.close()
    final_checkpoint = ckpts.path_for(es.generation)
    if not os.path.exists(final_checkpoint):
        ckpts.save(es, **extra())
    final = rows[-1] if rows else {}
    summary = {"task": task.name, "generations": es.generation, "seconds": final.get("seconds"),
               task.metric_name: final.get(task.metric_name), "target": task.target,
               "reached_target": bool(rows) and final[task.metric_name] >= task.target, "stopped": stop_reason,
               "population": es.population_size, "sigma": es.sigma, "antithetic": es.antithetic,
               "n_params": es.population.n_params, "device": str(es.device), "world_size": es.world_size,
               "comm_bytes_per_generation_per_rank": final.get("comm_bytes", 0),
               "nonfinite_total": sum(r.get("nonfinite", 0) for r in rows), "checkpoint": final_checkpoint,
               "out_dir": out_dir}
    if lead:
        torch.save(es.module.state_dict(), os.path.join(out_dir, "model.pt"))
        plot_curve(rows, task.metric_name, os.path.join(out_dir, "learning_curve.png"), task.name)
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
    return summary


def _stop_requested(es: ES, local_signal) -> bool:
    """Whether to stop now: this process got SIGINT / SIGTERM, or (with several ranks) any rank did,
    so that every rank stops after the same generation."""
    flag = local_signal is not None
    return flag if es.shard is None else es.shard.any(flag)


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        if rows:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def append_csv(row: dict, path: str) -> None:
    """One row, flushed: a run that crashes keeps its history up to its last generation."""
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


def plot_curve(rows: list[dict], metric: str, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gens = [r["generation"] for r in rows]
    fig, ax1 = plt.subplots(figsize=(7, 4))
    ax1.plot(gens, [r["fitness_mean"] for r in rows], color="tab:blue", label="mean fitness")
    ax1.set_xlabel("generation")
    ax1.set_ylabel("mean fitness", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(gens, [r[metric] for r in rows], color="tab:red", label=metric)
    ax2.set_ylabel(metric, color="tab:red")
    ax1.set_title(f"virtual_noise ES: {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
