"""Long runs lose nothing: rolling atomic checkpoints, clean interrupts, exact resume after kill -9,
clear errors for bad checkpoints and changed options, non-finite fitness."""

import csv
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from virtual_noise.es import ES, CheckpointError, Checkpointer
from virtual_noise.es import checkpoint as ckpt_module

RUN = ["--population", "128", "--hidden", "32", "--batch", "256", "--eval-every", "5", "--no-progress",
       "--checkpoint-every", "3"]
GENERATIONS = "150"  # ~30 ms each on 2 cores: kills land in the middle of the run


def cli(out, *args, timeout=300):
    cmd = [sys.executable, "-m", "virtual_noise", "train", "--out", str(out), *RUN, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def start(out, *args):
    cmd = [sys.executable, "-m", "virtual_noise", "train", "--out", str(out), *RUN, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def model_state(out):
    return torch.load(out / "model.pt")


def strip_seconds(path):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(open(path))]


def checkpoints(out):
    return sorted(p.name for p in out.glob("checkpoint-*.pt"))


def wait_for_checkpoint(out, newer_than, proc, timeout=120):
    """Until a checkpoint past generation ``newer_than`` exists (or the run ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        names = checkpoints(out)
        if names and int(names[-1][11:19]) > newer_than:
            return int(names[-1][11:19])
        time.sleep(0.05)
    return None


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    proc = cli(out, "--generations", GENERATIONS)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_kill_9_at_random_moments_then_resume_is_bit_identical(straight, tmp_path):
    """SIGKILL the run at random moments several times, resume each time until done: the final model and
    the metrics equal an uninterrupted run's."""
    out = tmp_path / "run"
    rng = random.Random(1234)
    kills, last = 0, 0
    proc = start(out, "--generations", GENERATIONS)
    while True:
        gen = wait_for_checkpoint(out, last, proc)
        if proc.poll() is not None:
            break
        time.sleep(rng.uniform(0.0, 0.6))  # somewhere in the next generations, maybe mid-write
        proc.kill()
        proc.wait()
        kills += 1
        last = gen
        rows = list(csv.DictReader(open(out / "metrics.csv")))
        assert len(rows) >= gen  # the history up to the kill is on disk
        assert len(checkpoints(out)) <= 2  # the last two kept
        proc = start(out, "--generations", GENERATIONS, "--resume")
        if kills == 4:
            break
    proc.communicate(timeout=300)
    assert proc.returncode == 0 and kills >= 3, kills
    a, b = model_state(straight), model_state(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert strip_seconds(straight / "metrics.csv") == strip_seconds(out / "metrics.csv")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_finishes_the_generation_writes_a_checkpoint_and_names_the_resume_command(sig, straight, tmp_path):
    out = tmp_path / "run"
    proc = start(out, "--generations", GENERATIONS)
    wait_for_checkpoint(out, 0, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"stopped by {signal.Signals(sig).name} after generation" in lines[0]
    assert "--resume" in lines[0] and "python -m virtual_noise train" in lines[0]
    gen = int(lines[0].split("after generation ")[1].split(";")[0])
    assert checkpoints(out)[-1] == f"checkpoint-{gen:08d}.pt"
    resumed = cli(out, "--generations", GENERATIONS, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = model_state(straight), model_state(out)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_checkpoints_give_one_line_errors(tmp_path):
    out = tmp_path / "run"
    missing = cli(out, "--generations", "4", "--resume")
    assert missing.returncode == 2 and "no checkpoint in" in missing.stderr and "Traceback" not in missing.stderr
    assert cli(out, "--generations", "6").returncode == 0
    names = checkpoints(out)
    assert names == ["checkpoint-00000003.pt", "checkpoint-00000006.pt"]
    newest, older = out / names[-1], out / names[0]
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated
    proc = cli(out, "--generations", "6", "--resume")
    assert proc.returncode == 0, proc.stderr  # the newest that loads: the older one, and the skip is reported
    assert f"skipping checkpoint {newest}: truncated or corrupt" in proc.stderr
    for p in out.glob("checkpoint-*.pt"):
        p.write_bytes(b"not a checkpoint")
    proc = cli(out, "--generations", "6", "--resume")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "truncated or corrupt" in proc.stderr
    torch.save({"some": "dict"}, older)  # loads, but is not ours
    proc = cli(out, "--generations", "6", "--resume")
    assert proc.returncode == 2 and "not a virtual_noise ES checkpoint" in proc.stderr


def test_resume_refuses_options_that_change_the_run_and_allows_harmless_ones(tmp_path):
    out = tmp_path / "run"
    assert cli(out, "--generations", "3").returncode == 0
    for args, flag in [(["--population", "64"], "--population"), (["--sigma", "0.2"], "--sigma"),
                       (["--noise", "lowrank"], "--noise"), (["--hidden", "16"], "--hidden"),
                       (["--no-antithetic"], "--antithetic")]:
        proc = cli(out, "--generations", "6", "--resume", *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"it was run with {flag} " in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = cli(out, "--generations", "6", "--resume", "--eval-every", "1", "--checkpoint-every", "2")
    assert proc.returncode == 0, proc.stderr  # more generations, other verbosity: allowed
    cos = tmp_path / "cos"
    assert cli(cos, "--generations", "3", "--lr-schedule", "cosine").returncode == 0
    proc = cli(cos, "--generations", "6", "--resume", "--lr-schedule", "cosine")
    assert proc.returncode == 2 and "cosine learning rate" in proc.stderr


def test_atomic_save_keeps_the_previous_file_when_a_write_fails(tmp_path, monkeypatch):
    es = ES(nn.Linear(3, 2), population_size=4)
    path = tmp_path / "c.pt"
    es.save(path, note=1)
    before = path.read_bytes()

    def crash(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_module.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        es.save(path, note=2)
    assert path.read_bytes() == before and list(tmp_path.iterdir()) == [path]  # no temporary left either
    monkeypatch.undo()
    assert es.load(path) == {"note": 1}
    with pytest.raises(CheckpointError, match=r"checkpoint .*missing.pt: no such file"):
        es.load(tmp_path / "missing.pt")


def test_checkpointer_from_the_api(tmp_path):
    es = ES(nn.Linear(3, 2), population_size=4, seed=3)
    saver = Checkpointer(tmp_path, every=2, minutes=None, keep=2)
    x = torch.randn(5, 3)
    for _ in range(7):
        es.ask()
        es.tell(-es.forward(x).pow(2).mean(dim=(1, 2)))
        saver.maybe_save(es, note=es.generation)
    assert [os.path.basename(p) for p in saver.files()] == ["checkpoint-00000004.pt", "checkpoint-00000006.pt"]
    path, skipped = saver.latest()
    fresh = ES(nn.Linear(3, 2), population_size=4, seed=3)
    assert fresh.load(path) == {"note": 6} and fresh.generation == 6 and skipped == []
    single = Checkpointer(tmp_path / "one", every=1, minutes=None, keep=1)
    for _ in range(3):
        es.ask()
        es.tell(-es.forward(x).pow(2).mean(dim=(1, 2)))
        single.save(es)
    assert [os.path.basename(p) for p in single.files()] == ["checkpoint-00000010.pt"]


def test_nonfinite_fitness_error_by_default_or_ranked_last():
    torch.manual_seed(0)
    x = torch.randn(5, 3)
    es = ES(nn.Linear(3, 2), population_size=6, fitness_shaping="centered_ranks")
    es.ask()
    bad = torch.tensor([0.1, float("nan"), 0.3, float("inf"), 0.2, 0.0])
    with pytest.raises(ValueError, match=r"fitness holds 2 NaN or inf values \(of 6\); pass nonfinite_fitness='worst'"):
        es.tell(bad)
    torch.manual_seed(0)
    worst = ES(nn.Linear(3, 2), population_size=6, nonfinite_fitness="worst", fitness_shaping="raw")
    worst.ask()
    same = ES(nn.Linear(3, 2), population_size=6, fitness_shaping="raw")
    same.module.load_state_dict(worst.module.state_dict())
    same.ask()
    # NaN / inf ranked as the worst finite value: the same step as with that value written in.
    stats = worst.tell(bad)
    same.tell(torch.tensor([0.1, 0.0, 0.3, 0.0, 0.2, 0.0]))
    assert stats["nonfinite"] == 2 and stats["max"] == pytest.approx(0.3)
    assert all(torch.equal(a, b) for a, b in zip(worst.module.parameters(), same.module.parameters()))
    ranks = ES(nn.Linear(3, 2), population_size=6, nonfinite_fitness="worst")
    ranks.ask()
    full = ranks.gather_fitness(bad)
    from virtual_noise.es import centered_ranks

    r = centered_ranks(full)
    assert r[1] < r[5] and r[3] < r[5] and r[1] == -0.5  # below the finite minimum 0.0
    del x
