"""Loads the compiled operators library, refusing a build made for another torch."""

from __future__ import annotations

import os

import torch

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
OPS_LIBRARY_PATH = os.path.join(_PACKAGE_DIR, "lib", "libvirtual_noise_ops.so")


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_torch_version(built_against: str, running: str) -> None:
    """Raise ImportError unless the running torch has the built-against major.minor.

    C++ operator libraries bind to one torch ABI; loading one built for another
    torch release can crash the process, so refuse before any binary is loaded.
    """
    if _major_minor(built_against) != _major_minor(running):
        raise ImportError(
            f"virtual_noise was built against torch {built_against}, but torch {running} is "
            f"installed. Rebuild it for this torch from the virtual-noise source folder: "
            f"pip install --no-build-isolation --no-deps --force-reinstall ."
        )


def load() -> None:
    from . import _build_config  # written by CMake, pure Python

    check_torch_version(_build_config.TORCH_VERSION, torch.__version__)
    torch.ops.load_library(OPS_LIBRARY_PATH)
