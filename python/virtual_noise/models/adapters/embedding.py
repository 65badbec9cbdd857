"""nn.Embedding through the fused perturbed gather: only the looked-up rows are hashed (low rank: only their
rows of the output factor, docs/lowrank.md)."""

from torch import nn

from ..bridge import population_embedding


class EmbeddingAdapter:
    name = "nn.Embedding"
    claims = ("weight",)
    lowrank_weight = True

    def matches(self, module) -> bool:
        # A subclass with its own forward may do more than this adapter knows.
        return isinstance(module, nn.Embedding) and type(module).forward is nn.Embedding.forward

    def forward(self, m, ctx, input):
        if m.max_norm is not None:
            raise ValueError(f"VirtualPopulation: nn.Embedding with max_norm={m.max_norm} renormalizes the rows "
                             f"it looks up in place, which cannot differ per individual; use max_norm=None")
        return population_embedding(ctx, input, m.weight, ctx.offset(m.weight), rank=ctx.rank(m.weight))
