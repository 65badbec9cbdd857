"""The ES toolkit: population forward, center round-trip, optimizer, shaping, checkpoints."""

import copy

import pytest
import torch
from reference import noise_ref
from torch import nn

import virtual_noise as vn
from virtual_noise.es import ES, VirtualPopulation, center_vector, centered_ranks, load_center, shape_fitness, z_score


def nested_model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU()),
                         nn.Linear(8, 3))


def reference_population(module, x, seeds, sigma, antithetic):
    """Materialize each individual as a plain module and run it: float64."""
    ref = copy.deepcopy(module).double()
    center = center_vector(ref)
    noise = noise_ref(seeds, center.numel(), 0, antithetic)
    outs = []
    for i in range(noise.shape[0]):
        load_center(ref, center + sigma * noise[i])
        xi = x if x.dim() == 2 else x[i]
        outs.append(ref(xi.double()))
    return torch.stack(outs)


def test_offsets_follow_named_parameters():
    m = nested_model()
    pop = VirtualPopulation(m)
    names = [n for n, _ in m.named_parameters()]
    assert [b.name for b in pop.blocks] == names
    assert [b.offset for b in pop.blocks] == vn.compute_offsets([p.shape for p in m.parameters()])
    assert pop.n_params == sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("antithetic", [True, False])
@pytest.mark.parametrize("per_individual", [False, True])
def test_population_forward_matches_materialized_reference(antithetic, per_individual):
    m = nested_model()
    seeds = torch.tensor([11, -4, 2**40])
    pop_size = 6 if antithetic else 3
    x = torch.randn(pop_size, 5, 6) if per_individual else torch.randn(5, 6)
    y = VirtualPopulation(m)(x, seeds, 0.2, antithetic)
    assert y.shape == (pop_size, 5, 3)
    torch.testing.assert_close(y.double(), reference_population(m, x, seeds, 0.2, antithetic), rtol=1e-4, atol=1e-5)


def test_sigma_zero_is_the_center():
    m = nested_model()
    x = torch.randn(4, 6)
    y = VirtualPopulation(m)(x, torch.arange(3), 0.0, True)
    torch.testing.assert_close(y, m(x).expand(6, 4, 3), rtol=1e-5, atol=1e-6)


def test_center_round_trip_into_plain_module():
    m = nested_model()
    c = center_vector(m) + 0.01 * torch.randn(sum(p.numel() for p in m.parameters()))
    load_center(m, c)
    plain = nested_model()  # a plain nn.Module, no package code in its forward
    plain.load_state_dict(m.state_dict())
    assert torch.equal(center_vector(plain), c)
    x = torch.randn(2, 6)
    assert torch.equal(plain(x), m(x))
    with pytest.raises(ValueError, match="center must be 1-D with"):
        load_center(m, c[:-1])


def test_shaping():
    f = torch.tensor([3.0, 1.0, 2.0, 10.0])
    assert centered_ranks(f).tolist() == pytest.approx([1 / 6, -0.5, -1 / 6, 0.5])
    z = z_score(f)
    assert z.mean().abs() < 1e-6 and (z.std() - 1).abs() < 1e-6
    assert torch.equal(shape_fitness(f, "raw"), f)
    with pytest.raises(ValueError, match="fitness_shaping must be one of"):
        shape_fitness(f, "softmax")


@pytest.mark.parametrize("antithetic", [True, False])
def test_gradient_estimate_is_unbiased_on_linear_objective(antithetic):
    # f(theta) = c . theta: the mean estimate must equal c (the noise variance 1/12 divided out).
    n = 12
    c = torch.linspace(-2, 3, n)
    module = nn.Sequential(nn.Linear(n, 1, bias=False))
    with torch.no_grad():  # theta = 0: no c . theta baseline inflating the raw estimate's variance
        module[0].weight.zero_()
    es = ES(module, population_size=2000, sigma=0.1, antithetic=antithetic, fitness_shaping="raw", seed=7)
    estimates = []
    for _ in range(40):
        es.ask()
        f = es.forward(c[None])[:, 0, 0]
        estimates.append(es.estimate_gradient(f)["0.weight"].flatten().double())
    est = torch.stack(estimates)
    mean, stderr = est.mean(0), est.std(0) / len(estimates) ** 0.5
    assert ((mean - c.double()).abs() < 5 * stderr).all(), (mean, c, stderr)
    # Power check: the interval is tight enough to catch a wrong scale (e.g. a missing 12x).
    assert (stderr < 0.05).all(), stderr


def test_antithetic_pairs_mirror():
    module = nn.Sequential(nn.Linear(4, 2))
    es = ES(module, population_size=8, seed=1)
    seeds = es.ask()
    assert seeds.shape == (4,) and seeds.dtype == torch.int64
    x = torch.randn(3, 4)
    y = es.forward(x)
    torch.testing.assert_close(y[0::2] + y[1::2], 2 * module(x).expand(4, 3, 2), rtol=1e-5, atol=1e-5)


def test_weight_decay_and_custom_optimizer():
    module = nn.Sequential(nn.Linear(3, 2))
    before = center_vector(module)
    es = ES(module, population_size=4, weight_decay=0.5, fitness_shaping="z_score",
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1), seed=0)
    es.ask()
    es.tell(torch.ones(4))  # equal fitness: no signal, only decay
    torch.testing.assert_close(center_vector(module), before * (1 - 0.1 * 0.5))


def test_es_argument_errors():
    m = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="population_size must be a positive int"):
        ES(m, population_size=0)
    with pytest.raises(ValueError, match="must be even with antithetic"):
        ES(m, population_size=5)
    with pytest.raises(ValueError, match="sigma must be finite and > 0"):
        ES(m, sigma=-1.0)
    with pytest.raises(ValueError, match="fitness_shaping must be one of"):
        ES(m, fitness_shaping="nope")
    es = ES(m, population_size=4)
    with pytest.raises(RuntimeError, match="call ask"):
        es.tell(torch.zeros(4))
    es.ask()
    with pytest.raises(ValueError, match="fitness must have population_size = 4"):
        es.tell(torch.zeros(3))
    with pytest.raises(ValueError, match="NaN or inf"):
        es.tell(torch.tensor([0.0, float("nan"), 0.0, 0.0]))


def run_generations(es, x, target, n):
    for _ in range(n):
        es.ask()
        es.tell(-((es.forward(x) - target) ** 2).mean(dim=(1, 2)))


def test_checkpoint_resume_is_bit_identical(tmp_path):
    torch.manual_seed(0)
    x, target = torch.randn(16, 5), torch.randn(16, 2)
    make = lambda: ES(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2)), population_size=32, seed=3)  # noqa: E731
    torch.manual_seed(1)
    straight = make()
    torch.manual_seed(1)
    first = make()
    run_generations(straight, x, target, 8)
    run_generations(first, x, target, 4)
    first.save(tmp_path / "ckpt.pt", note="hi")
    torch.manual_seed(99)  # a different initial center, overwritten by the checkpoint
    resumed = make()
    assert resumed.load(tmp_path / "ckpt.pt") == {"note": "hi"}
    assert resumed.generation == 4
    run_generations(resumed, x, target, 4)
    assert torch.equal(center_vector(resumed.module), center_vector(straight.module))


class EveryKind(nn.Module):
    """One parameter of every block kind: Linear, Conv2d, Embedding, MultiheadAttention, LayerNorm, a raw one."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.conv = nn.Conv2d(2, 3, 2, stride=2)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.scale = nn.Parameter(torch.ones(8))
        self.head = nn.Linear(8 + 18, 2)

    def forward(self, ids, img):
        h = self.emb(ids)
        h = self.norm(h + self.attn(h, h, h, need_weights=False)[0]) * self.scale
        c = self.conv(img).flatten(1)  # (B, 18)
        return self.head(torch.cat([h.mean(1), c], -1))


def every_kind_with_transformers():
    model = EveryKind()
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return model
    model.extra = Conv1D(2, 2)  # Hugging Face's (in, out) linear
    inner = model.forward
    model.forward = lambda ids, img: model.extra(inner(ids, img))
    return model


@pytest.mark.parametrize("antithetic", [True, False])
def test_step_equals_materialized_estimate_for_every_block_kind(antithetic):
    """With raw fitness, the estimate of every block (fused or materialized) is sum_i f_i N_i / (P sigma) / (1/12)
    with the noise materialized from the layout, and the step applies it."""
    torch.manual_seed(0)
    model = every_kind_with_transformers().eval()
    ids, img = torch.randint(0, 11, (3, 5)), torch.randn(3, 2, 4, 6)
    es = ES(model, population_size=8, sigma=0.05, antithetic=antithetic, fitness_shaping="raw",
            optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    named = list(model.named_parameters())
    assert [b.name for b in es.population.blocks] == [n for n, _ in named]
    before = {n: p.detach().clone() for n, p in named}
    seeds = es.ask()
    out = es.forward(ids, img)
    fitness = out.pow(2).mean(dim=(1, 2))
    estimate = es.estimate_gradient(fitness)
    noise = noise_ref(seeds, sum(p.numel() for _, p in named), 0, antithetic)
    want = fitness.double() @ noise / (8 * 0.05) * 12
    offset = 0
    for n, p in named:
        torch.testing.assert_close(estimate[n].double().flatten(), want[offset:offset + p.numel()],
                                   rtol=1e-4, atol=1e-5, msg=n)
        offset += p.numel()
    es.tell(fitness)
    for n, p in model.named_parameters():  # SGD: theta + lr * estimate
        torch.testing.assert_close(p.detach(), before[n] + 0.01 * estimate[n], rtol=1e-5, atol=1e-6, msg=n)


def test_evolve_subset_leaves_the_rest_unchanged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("0.")}
    es = ES(model, population_size=8, evolve=lambda n, p: n.startswith("2."), seed=3)
    assert [b.name for b in es.population.blocks] == ["2.weight", "2.bias"]
    assert sum(len(g["params"]) for g in es.optimizer.param_groups) == 2
    x = torch.randn(5, 4)
    for _ in range(3):
        es.ask()
        es.tell(-es.forward(x).pow(2).mean(dim=(1, 2)))
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p.detach(), frozen[n])
    with pytest.raises(ValueError, match="no parameter to evolve"):
        ES(model, evolve=[])
