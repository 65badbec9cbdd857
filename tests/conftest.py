import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import virtual_noise  # noqa: E402,F401  (loads the operators)

collect_ignore = ["interpret"]  # run by test_triton_interpreter.py under TRITON_INTERPRET=1


def cuda_ready() -> bool:
    return torch.cuda.is_available() and virtual_noise.build_info()["triton"]


def pytest_collection_modifyitems(config, items):
    if cuda_ready():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device and triton (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen():
    """Fresh random inputs per test, reproducible from the test's name."""
    import zlib

    g = torch.Generator().manual_seed(zlib.crc32(os.environ.get("PYTEST_CURRENT_TEST", "").encode()))
    return g
