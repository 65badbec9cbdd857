"""The main job: short end-to-end runs, resume, and option errors."""

import csv
import json
import subprocess
import sys

import pytest
import torch

from virtual_noise.__main__ import main


def train(tmp_path, *args):
    out = tmp_path / "run"
    assert main(["train", "--no-progress", "--out", str(out), *args]) == 0
    return out, json.loads((out / "summary.json").read_text())


def test_digits_short_run_beats_threshold(tmp_path):
    out, summary = train(tmp_path, "--generations", "60", "--eval-every", "20")
    assert summary["test_acc"] >= 0.85, summary
    for name in ["checkpoint-00000060.pt", "model.pt", "metrics.csv", "learning_curve.png", "summary.json"]:
        assert (out / name).stat().st_size > 0
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert len(rows) == 60 and rows[-1]["generation"] == "60"
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The trained center loads into a plain nn.Module, no virtual_noise involved.
    from virtual_noise.train.tasks import DigitsTask, mlp

    plain = mlp([64, 64, 10])
    plain.load_state_dict(torch.load(out / "model.pt"))
    task = DigitsTask("cpu", 0, 256)
    assert task.evaluate(plain) == pytest.approx(summary["test_acc"])


@pytest.mark.parametrize("model,generations,population,floor", [("cnn", 25, 64, 0.75), ("vit", 100, 128, 0.7)])
def test_digits_cnn_and_vit_train(tmp_path, model, generations, population, floor):
    """Short runs of the CNN and the ViT (their full defaults reach >= 95%: benchmarks/RESULTS.md)."""
    out, summary = train(tmp_path, "--model", model, "--generations", str(generations), "--eval-every", "25",
                         "--population", str(population))
    assert summary["test_acc"] >= floor, summary
    from virtual_noise.train.tasks import DigitsTask

    task = DigitsTask("cpu", 0, 64)
    plain = task.build_model(task.models[model]["hidden"], model)  # a plain module, no virtual_noise in it
    plain.load_state_dict(torch.load(out / "model.pt"))
    assert task.evaluate(plain) == pytest.approx(summary["test_acc"])


def test_cartpole_reaches_500(tmp_path):
    pytest.importorskip("gymnasium")
    _, summary = train(tmp_path, "--task", "cartpole", "--eval-every", "5")
    assert summary["test_return"] == 500.0 and summary["stopped"] == "target reached"


def test_resume_continues_identically(tmp_path):
    common = ["--generations", "6", "--population", "32", "--eval-every", "3"]
    straight, _ = train(tmp_path / "a", *common)
    resumed = tmp_path / "b" / "run"
    assert main(["train", "--no-progress", "--out", str(resumed), *common[:1], "3", *common[2:]]) == 0
    assert main(["train", "--no-progress", "--out", str(resumed), "--resume", *common]) == 0
    a, b = torch.load(straight / "model.pt"), torch.load(resumed / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(csv.DictReader(open(straight / "metrics.csv"))) == strip(csv.DictReader(open(resumed / "metrics.csv")))


@pytest.mark.parametrize("args,message", [
    (["--population", "-4"], "--population must be positive; got -4"),
    (["--population", "7"], "--population must be even with antithetic pairs"),
    (["--task", "chess"], "unknown task 'chess'; choose one of: digits, cartpole"),
    (["--model", "rnn"], "unknown --model 'rnn' for task digits; choose one of: mlp, cnn, vit"),
    (["--task", "cartpole", "--model", "vit"], "unknown --model 'vit' for task cartpole; choose one of: mlp"),
    (["--model", "cnn", "--hidden", "8"], "--hidden for --model cnn is the two conv widths"),
    (["--hidden", "64,x"], "--hidden must be comma-separated positive ints"),
    (["--sigma", "0"], "--sigma must be > 0"),
    (["--device", "tpu"], "--device must be cpu, cuda or cuda:N"),
] + ([] if torch.cuda.is_available() else [(["--device", "cuda"], "asked for CUDA, but no CUDA device")]))
def test_bad_options(args, message):
    proc = subprocess.run([sys.executable, "-m", "virtual_noise", "train", *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_odd_population_without_antithetic_is_fine(tmp_path):
    _, summary = train(tmp_path, "--population", "7", "--no-antithetic", "--generations", "2")
    assert summary["population"] == 7 and summary["antithetic"] is False
