"""nn.Linear (and its subclasses) through the fused perturbed linear."""

from torch import nn

from ..bridge import population_linear


class LinearAdapter:
    name = "nn.Linear"
    claims = ("weight", "bias")
    lowrank_weight = True  # its weight can take low-rank noise (one whole (rows, cols) block)

    def matches(self, module) -> bool:
        # A subclass with its own forward may do more than this adapter knows.
        return isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward

    def forward(self, m, ctx, input):
        return population_linear(ctx, input, m.weight, m.bias, ctx.offset(m.weight), ctx.offset(m.bias),
                                 rank=ctx.rank(m.weight))
