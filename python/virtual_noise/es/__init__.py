"""Evolution strategies on nn.Modules with virtual noise."""

from .checkpoint import CheckpointError, Checkpointer
from .optimizer import ES, NOISE_VARIANCE
from .population import VirtualPopulation, center_vector, load_center
from .shaping import centered_ranks, raw, shape_fitness, z_score

__all__ = ["CheckpointError", "Checkpointer", "ES", "NOISE_VARIANCE", "VirtualPopulation", "center_vector", "centered_ranks", "load_center",
           "raw", "shape_fitness", "z_score"]
