"""Runs tests/interpret (every Triton kernel) under TRITON_INTERPRET=1 on the CPU.

A subprocess, because the interpreter must be chosen before the kernels are
defined and this process may already hold compiled ones (on a GPU machine).
"""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def test_triton_kernels_interpreted_on_cpu():
    pytest.importorskip("triton")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: tests/test_cuda.py runs the compiled kernels instead")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(HERE, "interpret")],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
