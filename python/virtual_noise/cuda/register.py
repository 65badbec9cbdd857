"""Registers the Triton launchers as the CUDA kernels of the C++-defined operators."""
