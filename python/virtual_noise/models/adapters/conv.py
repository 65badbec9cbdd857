"""nn.Conv1d / nn.Conv2d: one convolution over materialized weights when the population's weights are
small, else the fused perturbed linear on unfolded patches.

A convolution is a linear layer applied to every input patch: with the weight
(out, C/groups, *kernel) flattened to (out, C/groups * K), row-major, its noise
layout is exactly the fused linear's, and ``F.unfold`` orders each patch's
columns (channel, kernel row, kernel column) as that flattening does. Groups
take contiguous row blocks of the weight and column blocks of the patches, so
each group is one fused call at its own offset. That path never stores a
perturbed weight, but its im2col is slow; while the population's perturbed
weights of a layer take at most MATERIALIZE_BYTES, one (grouped) convolution
over them is several times faster (docs/models.md, "Convolutions"). Stride,
padding (ints, 'same', 'valid', every padding_mode), dilation and groups are
supported on both paths.
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


#: Convolutions whose perturbed weights for the whole population take at most this many bytes run as
#: one convolution over per-individual weights (the weights are small next to the activations): on the
#: 2-core CPU a CNN policy's population forward (P=256, 8 frames of 3x18x18) took 25.9 ms through unfold +
#: the fused linear, most of it im2col, and 5.6-6.4 ms this way (docs/models.md, "Convolutions").
#: Larger ones take the unfold path, which never stores a (P, weight) tensor.
MATERIALIZE_BYTES = 64 << 20


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
        if w_off is not None and ctx.size * m.weight.numel() * m.weight.element_size() <= MATERIALIZE_BYTES:
            return population_call(ctx, lambda batched, xb: _grouped(m, ctx, nd, w_off, b_off, batched[0], xb), input)

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



def _grouped(m, ctx, nd, w_off, b_off, batched, xb):
    """Every individual's convolution as one convolution over materialized perturbed weights. Shared x:
    one convolution with P times the output channels (ordered group, individual, channel so that each
    of the layer's groups sees its own input channels). Per-individual x: one grouped convolution, input
    channels of individual i at [i*C, (i+1)*C) and its weights as groups [i*groups, (i+1)*groups)."""
    P, G, out = ctx.size, m.groups, m.out_channels
    no_batch_dim = xb.dim() - batched == nd + 1
    x = xb.unsqueeze(int(batched)) if no_batch_dim else xb  # (P, N, C, *s) or (N, C, *s)
    w = ctx.perturbed(m.weight, w_off)  # (P, out, C/groups, *kernel)
    b = None
    if m.bias is not None:
        b = ctx.perturbed(m.bias, b_off) if b_off is not None else m.bias.expand(P, -1)  # (P, out)
    conv = F.conv1d if nd == 1 else F.conv2d
    if batched:
        x = x.movedim(0, 1).flatten(1, 2)  # (N, P*C, *s)
        groups = G * P
    else:  # (G, P, out/G) channel order
        w = w.unflatten(1, (G, out // G)).movedim(1, 0)
        b = None if b is None else b.unflatten(1, (G, out // G)).movedim(1, 0)
        groups = G
    w, b = w.flatten(0, -nd - 2), None if b is None else b.reshape(-1)
    padding = m.padding
    if m.padding_mode != "zeros":
        x, padding = F.pad(x, m._reversed_padding_repeated_twice, mode=m.padding_mode), 0
    y = conv(x, w, b, m.stride, padding, m.dilation, groups)  # (N, P*out, *s')
    if batched:
        y = y.unflatten(1, (P, out)).movedim(1, 0)  # (P, N, out, *s')
    else:
        y = y.unflatten(1, (G, P, out // G)).movedim(2, 0).flatten(2, 3)  # (P, N, out, *s')
    return y.squeeze(1) if no_batch_dim else y
