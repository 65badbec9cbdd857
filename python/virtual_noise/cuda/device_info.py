"""Device facts the launchers size their grids and dot precision from."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _properties(index: int):
    return torch.cuda.get_device_properties(index)


def _device_properties(device: torch.device):
    return _properties(device.index if device.index is not None else torch.cuda.current_device())


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors (read from the device); 4 off-GPU (the interpreter)."""
    if device.type != "cuda":
        return 4
    return _device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def _max_shared_memory(index: int) -> int:
    import triton  # torch's device properties lack the opt-in maximum that Triton launches with

    return triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]


def max_shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one program may use (the opt-in maximum per block: 227 KiB on Hopper)."""
    return _max_shared_memory(device.index if device.index is not None else torch.cuda.current_device())


def compute_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) of a CUDA device, e.g. (9, 0) for Hopper (wgmma, TMA)."""
    props = _device_properties(device)
    return props.major, props.minor


def _nvidia_sm90_or_later(device: torch.device) -> bool:
    return device.type == "cuda" and torch.version.hip is None and compute_capability(device)[0] >= 9


def supports_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch (griddepcontrol): NVIDIA GPUs of compute capability 9.0 and later."""
    return _nvidia_sm90_or_later(device)


def supports_tma(device: torch.device) -> bool:
    """Tensor-memory-accelerator loads (tensor descriptors): NVIDIA GPUs of compute capability 9.0 and later."""
    return _nvidia_sm90_or_later(device)


def fp32_dot_precision(device: torch.device) -> str:
    """tl.dot input precision of x @ W^T for float32 inputs, following torch's matmul precision.

    "highest" -> tf32x3 (three tf32 products: float32-level accuracy on tensor
    cores); "high"/"medium" -> tf32. Off-GPU the interpreter computes in ieee.
    """
    if device.type != "cuda":
        return "ieee"
    return "tf32x3" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def noise_dot_precision(device: torch.device) -> str:
    """tl.dot input precision of the noise term x @ N^T for float32 inputs (virtual_noise.precision):
    tf32 by default, tf32x3 when opted in, torch's choice with "matmul"."""
    from ..precision import get_noise_precision

    setting = get_noise_precision()
    if device.type != "cuda":
        return "ieee"
    if setting == "matmul":
        return fp32_dot_precision(device)
    return "tf32x3" if setting == "highest" else "tf32"
