"""The training loop of the main job: progress bar, metrics CSV, curve PNG, checkpoint."""

from __future__ import annotations

import csv
import json
import math
import os
import time

import torch

from ..es import ES


def learning_rate(base: float, schedule: str, generation: int, generations: int) -> float:
    """The learning rate of a generation: constant, or cosine from base to 0 over the run."""
    if schedule == "cosine":
        return base * 0.5 * (1 + math.cos(math.pi * min(generation, generations) / generations))
    return base


def train(task, es: ES, *, generations: int, out_dir: str, eval_every: int = 10, time_limit: float | None = None,
          progress: bool = True, resume: bool = False, lr_schedule: str = "constant") -> dict:
    from tqdm import tqdm

    lead = es.rank == 0  # with several ranks, rank 0 reports and writes files
    progress = progress and lead
    if lead:
        os.makedirs(out_dir, exist_ok=True)
    ckpt_path = os.path.join(out_dir, "checkpoint.pt")
    rows: list[dict] = []
    if resume:
        extra = es.load(ckpt_path)
        task.generator.set_state(extra["task_generator"])
        rows = extra["metrics"]
    start = time.perf_counter()
    elapsed0 = rows[-1]["seconds"] if rows else 0.0
    metric = rows[-1][task.metric_name] if rows else float("nan")
    bar = tqdm(total=generations, initial=es.generation, desc=task.name, disable=not progress, unit="gen")
    stop_reason = "generations"
    base_lrs = [g["lr"] for g in es.optimizer.param_groups]
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
        rows.append({"generation": es.generation, "seconds": round(seconds, 4), "fitness_mean": stats["mean"],
                     "fitness_max": stats["max"], task.metric_name: metric,
                     "comm_bytes": 0 if es.shard is None else es.shard.bytes_last_generation})
        bar.update(1)
        bar.set_postfix({"fit": f"{stats['mean']:.3f}", task.metric_name: f"{metric:.3f}"})
        if getattr(task, "stop_at_target", False) and metric >= task.target:
            stop_reason = "target reached"
            break
        if time_limit is not None and seconds >= time_limit:
            stop_reason = "time limit"
            break
    bar.close()
    es.save(ckpt_path, task_generator=task.generator.get_state(), metrics=rows)
    final = rows[-1] if rows else {}
    summary = {"task": task.name, "generations": es.generation, "seconds": final.get("seconds"),
               task.metric_name: final.get(task.metric_name), "target": task.target,
               "reached_target": bool(rows) and final[task.metric_name] >= task.target, "stopped": stop_reason,
               "population": es.population_size, "sigma": es.sigma, "antithetic": es.antithetic,
               "n_params": es.population.n_params, "device": str(es.device), "world_size": es.world_size,
               "comm_bytes_per_generation_per_rank": final.get("comm_bytes", 0), "out_dir": out_dir}
    if lead:
        torch.save(es.module.state_dict(), os.path.join(out_dir, "model.pt"))
        write_csv(rows, os.path.join(out_dir, "metrics.csv"))
        plot_curve(rows, task.metric_name, os.path.join(out_dir, "learning_curve.png"), task.name)
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
    return summary


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        if rows:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


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
