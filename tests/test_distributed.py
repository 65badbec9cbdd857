"""Scale-out: one population over several gloo processes on the CPU (loopback)."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "distributed_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world, tmp_path, *args, timeout=120):
    out = tmp_path / f"result-{world}-{time.monotonic_ns()}.pt"
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, WORKER, "--out", str(out), *map(str, args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [(p.wait(timeout=timeout), *p.communicate()) for p in procs]
    return results, (torch.load(out) if out.exists() else None)


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_run_matches_single_process(world, tmp_path):
    (single_result,), single = launch(1, tmp_path)
    assert single_result[0] == 0, single_result[2][-2000:]
    results, multi = launch(world, tmp_path)
    assert all(rc == 0 for rc, _, _ in results), [e[-2000:] for _, _, e in results]
    assert multi["world"] == world and all(multi["identical"]) and len(multi["identical"]) == 5
    # Same seeds, same fitness; only the order of the gradient sum differs.
    torch.testing.assert_close(multi["center"], single["center"], rtol=1e-5, atol=1e-6)
    assert not torch.equal(multi["center"], torch.zeros_like(multi["center"]))
    # O(P + n_params) bytes per generation: padded fitness all-gather (float64) + gradient all-reduce (float32).
    pairs_per_rank = -(-15 // world)
    assert multi["comm_bytes"] == world * pairs_per_rank * 2 * 8 + multi["n_params"] * 4


def test_lowrank_noise_sharded_matches_single_process(tmp_path):
    (single_result,), single = launch(1, tmp_path, "--noise", "lowrank")
    assert single_result[0] == 0, single_result[2][-2000:]
    results, multi = launch(2, tmp_path, "--noise", "lowrank")
    assert all(rc == 0 for rc, _, _ in results), [e[-2000:] for _, _, e in results]
    assert all(multi["identical"])
    torch.testing.assert_close(multi["center"], single["center"], rtol=1e-5, atol=1e-6)
    (full_result,), full = launch(1, tmp_path)
    assert not torch.allclose(full["center"], single["center"])  # another noise, another run


def test_recompute_mode_matches_all_reduce(tmp_path):
    results, a = launch(2, tmp_path, "--mode", "all_reduce")
    results_b, b = launch(2, tmp_path, "--mode", "recompute")
    assert all(rc == 0 for rc, _, _ in results + results_b)
    torch.testing.assert_close(a["center"], b["center"], rtol=1e-5, atol=1e-6)
    assert b["comm_bytes"] == 2 * 8 * 2 * 8  # fitness only: 2 ranks x 8 pairs x 2 members x 8 bytes


def test_resume_from_checkpoint_continues_identically(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    _, straight = launch(2, tmp_path, "--generations", 6)
    first, _ = launch(2, tmp_path, "--generations", 3, "--ckpt", ckpt, "--save-at", 3)
    assert all(rc == 0 for rc, _, _ in first) and ckpt.exists()
    second, resumed = launch(2, tmp_path, "--generations", 6, "--ckpt", ckpt, "--resume")
    assert all(rc == 0 for rc, _, _ in second)
    assert torch.equal(resumed["center"], straight["center"])


def test_dead_rank_fails_the_others_quickly(tmp_path):
    start = time.monotonic()
    results, _ = launch(2, tmp_path, "--fail-rank", 1, "--fail-at", 2, "--timeout", 10, timeout=90)
    elapsed = time.monotonic() - start
    (rc0, _, err0), (rc1, _, _) = results
    assert rc1 == 3 and rc0 != 0
    assert "virtual_noise ES: all_gather of fitness failed on rank 0 of 2" in err0
    assert "--resume" in err0
    assert elapsed < 60


def test_cli_under_torchrun(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "virtual_noise", "train", "--generations", "4", "--population", "64", "--eval-every", "2",
           "--no-progress", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["generations"] == 4
    assert "2 ranks (gloo)" in proc.stdout
    assert "communication per generation and rank:" in proc.stdout
    assert proc.stdout.count("done:") == 1  # only rank 0 reports


def test_cli_resume_under_torchrun(tmp_path):
    """Two ranks: rank 0 writes the checkpoints, both resume from the same file, and the result equals an
    uninterrupted two-rank run's."""
    def torchrun(out, *args):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(free_port()), "-m", "virtual_noise", "train", "--population", "64", "--eval-every", "2",
               "--no-progress", "--checkpoint-every", "2", "--out", str(out), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})

    straight, resumed = tmp_path / "a", tmp_path / "b"
    assert torchrun(straight, "--generations", "6").returncode == 0
    first = torchrun(resumed, "--generations", "4")
    assert first.returncode == 0, first.stderr[-2000:]
    assert sorted(p.name for p in resumed.glob("checkpoint-*.pt")) == ["checkpoint-00000002.pt",
                                                                        "checkpoint-00000004.pt"]
    second = torchrun(resumed, "--generations", "6", "--resume")
    assert second.returncode == 0, second.stderr[-2000:]
    a, b = torch.load(straight / "model.pt"), torch.load(resumed / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
