"""The model layer: any nn.Module as a population with virtual noise.

``VirtualPopulation`` (population.py) runs it; ``layout.py`` says where each
evolved parameter's noise lives; ``adapters/`` holds one adapter per layer
kind whose parameters go through fused operators (the registry); ``bridge.py``
connects the per-individual model code to those operators.
"""

from .adapters import REGISTRY, adapter_for
from .layout import Block, evolved_blocks
from .population import MAX_MATERIALIZED, PopulationError, VirtualPopulation

__all__ = ["Block", "MAX_MATERIALIZED", "PopulationError", "REGISTRY", "VirtualPopulation", "adapter_for",
           "evolved_blocks"]
