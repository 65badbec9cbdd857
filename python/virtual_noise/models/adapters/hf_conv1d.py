"""Hugging Face's Conv1D (GPT-2's projections): a linear layer whose weight is stored (in, out).

Matched by class, without importing transformers. Its noise follows the stored
layout (element (k, j) of the (in, out) weight at offset + k*out + j), which the
fused operator takes with ``transposed=True``.
"""

from ..bridge import population_linear


class HFConv1DAdapter:
    name = "transformers Conv1D"
    claims = ("weight", "bias")
    lowrank_weight = True  # its weight can take low-rank noise (one whole (rows, cols) block)

    def matches(self, module) -> bool:
        cls = type(module)
        return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers") and hasattr(module, "nf")

    def forward(self, m, ctx, x):
        return population_linear(ctx, x, m.weight, m.bias, ctx.offset(m.weight), ctx.offset(m.bias),
                                 transposed=True, rank=ctx.rank(m.weight))
