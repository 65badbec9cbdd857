"""nn.Conv1d / nn.Conv2d through the fused perturbed linear on unfolded patches.

A convolution is a linear layer applied to every input patch: with the weight
(out, C/groups, *kernel) flattened to (out, C/groups * K), row-major, its noise
layout is exactly the fused linear's, and ``F.unfold`` orders each patch's
columns (channel, kernel row, kernel column) as that flattening does. Groups
take contiguous row blocks of the weight and column blocks of the patches, so
each group is one fused call at its own offset. Measured against a fused conv
kernel's alternative (materialized weights through a grouped conv), see
docs/models.md; stride, padding (ints, 'same', 'valid', every padding_mode),
dilation and groups are supported.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ...ops import virtual_perturbed_linear
from ..bridge import _bias_term, population_call


def _explicit_padding(m, nd: int):
    """(F.pad amounts or None, unfold's symmetric padding) for the module's padding settings."""
    if m.padding_mode != "zeros":
        return list(m._reversed_padding_repeated_twice), (0,) * nd, m.padding_mode
    if isinstance(m.padding, str):
        if m.padding == "valid":
            return None, (0,) * nd, "constant"
        pads = []  # 'same': total d*(k-1) per dim, the odd one on the right, last dim first for F.pad
        for d, k in zip(reversed(m.dilation), reversed(m.kernel_size)):
            total = d * (k - 1)
            pads += [total // 2, total - total // 2]
        return pads, (0,) * nd, "constant"
    return None, tuple(m.padding), "constant"


class ConvAdapter:
    name = "nn.Conv1d, nn.Conv2d"
    claims = ("weight", "bias")
    lowrank_weight = False

    def matches(self, module) -> bool:
        # A subclass with its own forward may do more than this adapter knows.
        return type(module).forward in (nn.Conv1d.forward, nn.Conv2d.forward) and isinstance(module, (nn.Conv1d, nn.Conv2d))

    def forward(self, m, ctx, input):
        nd = 1 if isinstance(m, nn.Conv1d) else 2
        w_off, b_off = ctx.offset(m.weight), ctx.offset(m.bias)
        out_c, groups = m.out_channels, m.groups
        w2 = m.weight.reshape(out_c, -1)  # (out, C/groups * K): the flat row-major layout
        og, cgk = out_c // groups, w2.shape[1]
        fuse = groups == 1 and w_off is not None and b_off is not None and b_off == w_off + m.weight.numel()
        pads, padding, mode = _explicit_padding(m, nd)

        def rule(batched, xb):
            P = ctx.size
            no_batch_dim = xb.dim() - batched[0] == nd + 1  # (C, *spatial): unbatched conv input
            x = xb.unsqueeze(int(batched[0])) if no_batch_dim else xb
            n = x.shape[int(batched[0])]
            x = x.flatten(0, 1) if batched[0] else x  # (P*N or N, C, *spatial)
            if pads is not None:
                x = F.pad(x, pads, mode=mode)
            kernel, stride, dilation, pad = m.kernel_size, m.stride, m.dilation, padding
            if nd == 1:  # as 2-D with one row
                x, kernel, stride, dilation, pad = x.unsqueeze(-2), (1, *kernel), (1, *stride), (1, *dilation), (0, *pad)
            h, w = x.shape[-2:]
            ho = (h + 2 * pad[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
            wo = (w + 2 * pad[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
            patches = F.unfold(x, kernel, dilation, pad, stride).transpose(1, 2)  # (N', L, C*K)
            patches = patches.reshape(P, -1, patches.shape[-1]) if batched[0] else patches.reshape(-1, patches.shape[-1])
            outs = []
            for g in range(groups):
                xg = patches[..., g * cgk:(g + 1) * cgk] if groups > 1 else patches
                wg = w2[g * og:(g + 1) * og]
                if w_off is not None:
                    outs.append(virtual_perturbed_linear(xg, wg, m.bias if fuse else None, ctx.seeds, ctx.sigma,
                                                         w_off + g * og * cgk, antithetic=ctx.antithetic))
                else:
                    outs.append(F.linear(xg, wg))
            y = outs[0] if groups == 1 else torch.cat(outs, dim=-1)
            if not fuse:
                b = _bias_term(ctx, m.bias, b_off)
                if b is not None:
                    y = y + b
            if y.dim() == 2:
                y = y.expand(P, *y.shape)
            y = y.reshape(P, n, ho, wo, out_c).permute(0, 1, 4, 2, 3)
            if nd == 1:
                y = y.squeeze(3)
            return y.squeeze(1) if no_batch_dim else y

        return population_call(ctx, rule, input)

