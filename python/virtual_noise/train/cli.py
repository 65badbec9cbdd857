"""Arguments and entry of ``python -m virtual_noise train``."""

from __future__ import annotations

import argparse
import json

import torch

from .tasks import TASKS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", default="digits", help=f"one of {', '.join(TASKS)} (default digits)")
    p.add_argument("--model", default="mlp", help="digits: mlp, cnn or vit; cartpole: mlp (default mlp)")
    p.add_argument("--population", type=int, help="individuals per generation (task default)")
    p.add_argument("--sigma", type=float, help="noise scale (task default)")
    p.add_argument("--lr", type=float, help="Adam learning rate (task default)")
    p.add_argument("--generations", type=int, help="generations to run (task default)")
    p.add_argument("--hidden", type=str, help="hidden sizes, comma separated: the MLP's layers (e.g. 64,64), the "
                   "CNN's two conv widths (8,16), the ViT's width (32) (model default)")
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], help="learning rate over the run (model default)")
    p.add_argument("--batch", type=int, help="minibatch size (digits)")
    p.add_argument("--shaping", default="centered_ranks", choices=["centered_ranks", "z_score", "raw"])
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--no-antithetic", action="store_true", help="independent noise per individual")
    p.add_argument("--noise", default="full", choices=["full", "lowrank"],
                   help="full-rank noise, or low-rank (EGGROLL-style) noise on the weights of linear and embedding layers")
    p.add_argument("--rank", type=int, default=None, help="rank of low-rank noise (default 4 with --noise lowrank)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--seed", type=int, default=0, help="one number makes the run reproducible")
    p.add_argument("--out", default=None, help="output directory (default runs/<task>)")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--time-limit", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --out, exactly as if the run had not stopped")
    p.add_argument("--checkpoint-every", type=int, default=50,
                   help="write a checkpoint every N generations (default 50; also every --checkpoint-minutes)")
    p.add_argument("--checkpoint-minutes", type=float, default=10.0, help="and every M minutes (default 10)")
    p.add_argument("--keep-checkpoints", type=int, default=2, help="checkpoints kept (default 2)")
    p.add_argument("--nonfinite-fitness", default="error", choices=["error", "worst"],
                   help="a NaN or inf fitness stops the run (error, default) or ranks last (worst)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--dist-timeout", type=float, default=120.0,
                   help="seconds a collective may wait under torchrun before the run fails (default 120)")


def resolve(args: argparse.Namespace, error) -> dict:
    """Task defaults filled in, every option checked; calls error(msg) on bad options."""
    if args.task not in TASKS:
        error(f"unknown task {args.task!r}; choose one of: {', '.join(TASKS)}")
    task_cls = TASKS[args.task]
    if args.model not in task_cls.models:
        error(f"unknown --model {args.model!r} for task {args.task}; choose one of: {', '.join(task_cls.models)}")
    cfg = {**task_cls.defaults, **task_cls.models[args.model]}
    for key in ("population", "sigma", "lr", "generations", "batch", "lr_schedule"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.hidden is not None:
        try:
            cfg["hidden"] = [int(h) for h in args.hidden.split(",") if h.strip()]
        except ValueError:
            error(f"--hidden must be comma-separated positive ints, e.g. 64,64; got {args.hidden!r}")
        if any(h <= 0 for h in cfg["hidden"]):
            error(f"--hidden sizes must be positive; got {args.hidden!r}")
    antithetic = not args.no_antithetic
    if cfg["population"] <= 0:
        error(f"--population must be positive; got {cfg['population']}")
    if antithetic and cfg["population"] % 2:
        error(f"--population must be even with antithetic pairs (or pass --no-antithetic); got {cfg['population']}")
    if not cfg["sigma"] > 0:
        error(f"--sigma must be > 0; got {cfg['sigma']}")
    if not cfg["lr"] > 0:
        error(f"--lr must be > 0; got {cfg['lr']}")
    if cfg["generations"] <= 0:
        error(f"--generations must be positive; got {cfg['generations']}")
    if args.eval_every <= 0:
        error(f"--eval-every must be positive; got {args.eval_every}")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        error(f"--device must be cpu, cuda or cuda:N; got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        error(f"--device {args.device} asked for CUDA, but no CUDA device is available here")
    if device.type not in ("cpu", "cuda"):
        error(f"--device must be cpu, cuda or cuda:N; got {args.device!r}")
    if args.rank is not None and args.noise != "lowrank":
        error("--rank applies to --noise lowrank")
    rank = (4 if args.rank is None else args.rank) if args.noise == "lowrank" else None
    if rank is not None and rank < 1:
        error(f"--rank must be >= 1; got {rank}")
    if args.checkpoint_every < 1:
        error(f"--checkpoint-every must be >= 1; got {args.checkpoint_every}")
    if not args.checkpoint_minutes > 0:
        error(f"--checkpoint-minutes must be > 0; got {args.checkpoint_minutes}")
    if args.keep_checkpoints < 1:
        error(f"--keep-checkpoints must be >= 1; got {args.keep_checkpoints}")
    if not args.dist_timeout > 0:
        error(f"--dist-timeout must be > 0; got {args.dist_timeout}")
    cfg.update(task=args.task, model=args.model, antithetic=antithetic, device=device, noise=args.noise, rank=rank,
               out=args.out or f"runs/{args.task}" + (f"-{args.model}" if args.model != "mlp" else ""))
    return cfg


def resume_command() -> str:
    """The command line of this run with --resume: what the user types to continue it."""
    import shlex
    import sys

    argv = [a for a in sys.argv[1:] if a != "--resume"]
    if argv and argv[0] != "train":
        argv = ["train", *argv]
    return "python -m virtual_noise " + " ".join(shlex.quote(a) for a in argv) + " --resume"


def run(args: argparse.Namespace, error) -> int:
    import sys

    from ..es import ES
    from .loop import RUN_OPTIONS, RunError, RunInterrupted, train

    import os

    from ..es.distributed import init_from_env, leave_and_exit

    cfg = resolve(args, error)
    distributed = init_from_env(cfg["device"], args.dist_timeout)
    if distributed and cfg["device"].type == "cuda":  # one GPU per process under torchrun
        cfg["device"] = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(cfg["device"])
    torch.manual_seed(args.seed)  # the initial center, identical on every rank
    task = TASKS[cfg["task"]](cfg["device"], args.seed, cfg["batch"])
    try:
        module = task.build_model(cfg["hidden"], cfg["model"]).to(cfg["device"])
    except ValueError as e:
        error(str(e))
    es = ES(module, population_size=cfg["population"], sigma=cfg["sigma"], lr=cfg["lr"],
            antithetic=cfg["antithetic"], fitness_shaping=args.shaping, weight_decay=args.weight_decay, seed=args.seed,
            noise=cfg["noise"], rank=cfg["rank"], nonfinite_fitness=args.nonfinite_fitness)
    say = print if es.rank == 0 else (lambda *a, **k: None)
    say(f"virtual_noise ES | task {task.name} | model {cfg['model']} | {es.population.n_params} parameters | population "
        f"{es.population_size}{' (antithetic)' if es.antithetic else ''} | "
        f"{'low-rank noise, rank ' + str(cfg['rank']) if cfg['noise'] == 'lowrank' else 'full-rank noise'} | "
        f"sigma {es.sigma} | lr {cfg['lr']} | "
        f"device {cfg['device']}" + (f" | {es.world_size} ranks ({torch.distributed.get_backend()})" if distributed else ""))
    run_settings = {**cfg, "shaping": args.shaping, "weight_decay": args.weight_decay, "seed": args.seed,
                    "nonfinite_fitness": args.nonfinite_fitness}
    options = {key: run_settings[key] for key in RUN_OPTIONS}  # what a resume must not change
    try:
        summary = train(task, es, generations=cfg["generations"], out_dir=cfg["out"], eval_every=args.eval_every,
                        time_limit=args.time_limit, progress=not args.no_progress, resume=args.resume,
                        lr_schedule=cfg["lr_schedule"], options=options, checkpoint_every=args.checkpoint_every,
                        checkpoint_minutes=args.checkpoint_minutes, keep_checkpoints=args.keep_checkpoints,
                        resume_command=resume_command())
    except RunError as e:
        if es.rank == 0:
            print(f"virtual-noise train: error: {e}", file=sys.stderr)
        if distributed:
            leave_and_exit(es.shard, 2)
        return 2
    except RunInterrupted as e:
        if es.rank == 0:
            print(f"virtual-noise train: {e}", file=sys.stderr)
        if distributed:
            leave_and_exit(es.shard, e.status)
        return e.status
    if distributed:
        say(f"communication per generation and rank: {summary['comm_bytes_per_generation_per_rank']:,} bytes "
            f"(fitness all-gather + gradient all-reduce payload; O(P + n_params))")
    say(f"done: {summary['generations']} generations in {summary['seconds']:.1f} s | "
          f"{task.metric_name} {summary[task.metric_name]:.4f} (target {task.target}, "
          f"{'reached' if summary['reached_target'] else 'NOT reached'}) | stopped: {summary['stopped']}")
    say(f"wrote {summary['checkpoint']}, {cfg['out']}/model.pt, metrics.csv, learning_curve.png, summary.json")
    say(json.dumps(summary))
    if distributed:
        leave_and_exit(es.shard, 0)  # does not return (see its docstring: gloo's exit-time abort)
    return 0
