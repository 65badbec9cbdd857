"""opcheck, torch.compile, torch.export and TorchScript on the operators."""

import pytest
import torch
from reference import perturbed_linear_ref

import virtual_noise as vn

ops = torch.ops.virtual_noise


def samples():
    g = torch.Generator().manual_seed(5)
    s = torch.randint(0, 2**40, (3,), generator=g)
    x, xp = torch.randn(4, 6, generator=g), torch.randn(6, 4, 6, generator=g)
    w, b = torch.randn(5, 6, generator=g), torch.randn(5, generator=g)
    f = torch.randn(6, generator=g)
    return [
        (ops.perturbed_linear, (x, w, b, s, 0.1, 0, False)),
        (ops.perturbed_linear, (x, w, None, s, 0.1, 2**33, True)),
        (ops.perturbed_linear, (xp.half(), w.half(), b.half(), s, 0.2, 3, True)),
        (ops.perturbed_linear, (xp[:3].bfloat16(), w.bfloat16(), None, s.int(), 0.2, 3, False)),
        (ops.perturbed_linear, (x, w.t().contiguous(), b, s, 0.1, 5, True, True)),
        (ops.perturbed_linear, (xp[:3], w.t(), None, s, 0.1, 5, False, True)),
        (ops.perturbed_embedding, (torch.tensor([0, 4, 4, 1]), w, s, 0.1, 7, False)),
        (ops.perturbed_embedding, (torch.tensor([0, 4, 4, 1]).int(), w.bfloat16(), s, 0.1, 7, True)),
        (ops.perturbed_embedding, (torch.randint(0, 5, (6, 3), generator=g), w, s, 0.1, 7, True)),
        (ops.lowrank_perturbed_linear, (x, w, b, s, 0.1, 0, 2, True, False)),
        (ops.lowrank_perturbed_linear, (xp.bfloat16(), w.t().bfloat16(), None, s, 0.1, 4, 1, True, True)),
        (ops.lowrank_weight_gradient, (f, s, [5, 6], 0.1, 6, 0, 2, True)),
        (ops.generate_lowrank_noise, (s, [5, 6], 2, 2**33)),
        (ops.weight_gradient, (f, s, [5, 6], 0.1, 6, 0, True)),
        (ops.weight_gradient, (f[:3].double(), s, [2, 2], 0.3, 3, 7, False)),
        (ops.bias_gradient, (f[:3], s, [5], 0.1, 3, 30, False)),
        (ops.bias_gradient, (f, s, [5], 0.1, 6, 30, True)),
        (ops.reduce_metric, (w, s, 0.1, 30, 0, False)),
        (ops.reduce_metric, (b.half(), s, 0.1, 5, 9, True)),
        (ops.generate_noise, (s, 17, 2**40)),
        (ops.generate_noise, (s[:0], 3, 0)),
    ]


@pytest.mark.parametrize("op,args", samples(), ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_opcheck(op, args):
    torch.library.opcheck(op, args)


def population_forward(x, w1, b1, w2, b2, seeds):
    h = torch.relu(ops.perturbed_linear(x, w1, b1, seeds, 0.1, 0, True))
    return ops.perturbed_linear(h, w2, b2, seeds, 0.1, w1.numel() + b1.numel(), True)


def mlp_args():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(3, 8, generator=g), torch.randn(16, 8, generator=g), torch.randn(16, generator=g),
            torch.randn(4, 16, generator=g), torch.randn(4, generator=g), torch.arange(5))


def test_torch_compile_fullgraph():
    args = mlp_args()
    compiled = torch.compile(population_forward, fullgraph=True)
    torch.testing.assert_close(compiled(*args), population_forward(*args))


class PopulationMLP(torch.nn.Module):
    def forward(self, x, w1, b1, w2, b2, seeds):
        return population_forward(x, w1, b1, w2, b2, seeds)


def test_torch_export():
    args = mlp_args()
    exported = torch.export.export(PopulationMLP(), args)
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "virtual_noise.perturbed_linear.default" in targets
    torch.testing.assert_close(exported.module()(*args), population_forward(*args))


class ScriptedPopulationLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(8.0).reshape(2, 4) / 8)
        self.bias = torch.nn.Parameter(torch.tensor([0.5, -0.5]))

    def forward(self, x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        return torch.ops.virtual_noise.perturbed_linear(x, self.weight, self.bias, seeds, 0.25, 3, False)


def test_torchscript_script_save_load(tmp_path):
    module = torch.jit.script(ScriptedPopulationLinear())
    path = tmp_path / "m.pt"
    module.save(str(path))
    loaded = torch.jit.load(str(path))
    x, s = torch.randn(3, 4), torch.tensor([5, 6])
    ref = perturbed_linear_ref(x, module.weight.detach(), module.bias.detach(), s, 0.25, 3)
    torch.testing.assert_close(loaded(x, s).double(), ref, rtol=1e-5, atol=1e-6)
