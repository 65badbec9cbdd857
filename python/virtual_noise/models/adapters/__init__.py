"""Layer adapters: one per layer kind whose parameters go through a fused virtual-noise operator.

Each adapter says which modules it serves (``matches``), which of their
parameters it perturbs itself (``claims``), and replaces the module's forward
during a population call (``forward(module, ctx, *args, **kwargs)``, written
for one individual, as the module's own forward is; the perturbed products go
through ``models.bridge``). Every other parameter of a model (norms' weights,
raw nn.Parameters used in a custom forward) is small and takes materialized
per-individual noise instead (``VirtualPopulation``'s ``max_materialized``).
"""

from __future__ import annotations

from torch import nn

from .conv import ConvAdapter
from .embedding import EmbeddingAdapter
from .hf_conv1d import HFConv1DAdapter
from .linear import LinearAdapter
from .multihead_attention import MultiheadAttentionAdapter

#: The one registry of layers whose parameters are perturbed through fused operators.
REGISTRY = (LinearAdapter(), HFConv1DAdapter(), ConvAdapter(), EmbeddingAdapter(), MultiheadAttentionAdapter())


def adapter_for(module: nn.Module):
    """The adapter serving ``module``, or None."""
    for adapter in REGISTRY:
        if adapter.matches(module):
            return adapter
    return None


def supported_layers() -> str:
    return ", ".join(a.name for a in REGISTRY)
