"""Low-rank noise at the model and ES level: the layout per block, exactness, the estimate, the CLI."""

import pytest
import torch
from model_zoo import GPTDecoder, hf_gpt2
from reference import assert_population_close, lowrank_noise_ref, noise_ref
from torch import nn
from torch.func import functional_call

from virtual_noise.es import ES
from virtual_noise.models import VirtualPopulation


def lowrank_reference(model, pop, args, seeds, sigma, antithetic, args_of=None):
    """functional_call with explicitly perturbed parameters: low-rank blocks from their factors, the rest full."""
    P = seeds.numel() * (2 if antithetic else 1)
    outs = []
    for i in range(P):
        params = {}
        for b in pop.blocks:
            r = pop.ranks.get(b.name, 0)
            if r:
                n = lowrank_noise_ref(seeds, *b.param.shape, r, b.offset, antithetic)[i]
            else:
                n = noise_ref(seeds, b.numel, b.offset, antithetic)[i].view(b.param.shape)
            params[b.name] = (b.param.detach().float() + sigma * n.float()).to(b.param.dtype)
        outs.append(functional_call(model, params, args if args_of is None else args_of(i), tie_weights=True))
    return outs


@pytest.mark.parametrize("antithetic", [True, False])
@pytest.mark.parametrize("per_individual", [False, True])
def test_lowrank_population_matches_functional_call(antithetic, per_individual):
    torch.manual_seed(0)
    model = GPTDecoder().eval()
    pop = VirtualPopulation(model, noise="lowrank", rank=2, noise_overrides={"blocks.0.proj.weight": "full",
                                                                            "blocks.1.qkv.weight": 5})
    # Linear and embedding weights take low rank (the head tied to the token embedding with it); norms stay full.
    assert pop.ranks["blocks.1.fc.weight"] == 2 and pop.ranks["blocks.1.qkv.weight"] == 5
    assert pop.ranks["tok.weight"] == 2 and pop.ranks["pos.weight"] == 2
    assert "blocks.0.proj.weight" not in pop.ranks and "ln_f.weight" not in pop.ranks
    seeds = torch.tensor([3, -3])
    P = 4 if antithetic else 2
    ids = torch.randint(0, 40, (P, 2, 9) if per_individual else (2, 9))
    out = pop(ids, seeds=seeds, sigma=0.05, antithetic=antithetic, per_individual=per_individual)
    refs = lowrank_reference(model, pop, None, seeds, 0.05, antithetic,
                             args_of=lambda i: (ids[i],) if per_individual else (ids,))
    assert_population_close(out, refs, 2e-5, 2e-5)


def test_lowrank_on_hugging_face_conv1d_and_multihead_attention():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    gpt2 = hf_gpt2()
    pop = VirtualPopulation(gpt2, noise="lowrank", rank=3)
    assert pop.ranks["transformer.h.0.attn.c_attn.weight"] == 3  # (in, out) stored: transposed operator
    ids, seeds = torch.randint(3, 64, (1, 6)), torch.tensor([7])
    out = pop(ids, seeds=seeds, sigma=0.05)
    refs = lowrank_reference(gpt2, pop, (ids,), seeds, 0.05, True)
    torch.testing.assert_close(out.logits, torch.stack([r.logits for r in refs]), rtol=1e-4, atol=1e-4)
    mha = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    pop = VirtualPopulation(mha, noise="lowrank", rank=2)
    assert list(pop.ranks) == ["out_proj.weight"]  # the in-projection is applied in row slices: full rank
    x = torch.randn(2, 5, 16)
    out = pop(x, x, x, seeds=seeds, sigma=0.05)
    refs = lowrank_reference(mha, pop, (x, x, x), seeds, 0.05, True)
    torch.testing.assert_close(out[0], torch.stack([r[0] for r in refs]), rtol=2e-5, atol=2e-5)


def test_lowrank_choices_and_errors():
    model = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 2))
    pop = VirtualPopulation(model, noise="lowrank", rank=3)
    assert pop.ranks == {"0.weight": 3}  # (6 + 2) * 3 > 12: the small layer stays full rank
    with pytest.raises(ValueError, match="noise='lowrank' needs `rank`"):
        VirtualPopulation(model, noise="lowrank")
    with pytest.raises(ValueError, match="`noise` must be 'full' or 'lowrank'"):
        VirtualPopulation(model, noise="sparse", rank=2)
    with pytest.raises(ValueError, match=r"noise_overrides\['2.weight'\]: rank 3 does not fit the \(2, 6\) block"):
        VirtualPopulation(model, noise_overrides={"2.weight": 3})
    with pytest.raises(ValueError, match=r"noise_overrides\['0.bias'\]: low-rank noise serves the weights"):
        VirtualPopulation(model, noise_overrides={"0.bias": 1})
    with pytest.raises(ValueError, match=r"`noise_overrides` names no evolved parameter: 'nope'"):
        VirtualPopulation(model, noise_overrides={"nope": 1})
    assert VirtualPopulation(model, noise_overrides={"2.weight": 1}).ranks == {"2.weight": 1}  # mixed per block


@pytest.mark.parametrize("antithetic", [True, False])
def test_lowrank_step_equals_materialized_estimate(antithetic):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(12, 10), nn.Tanh(), nn.Linear(10, 3))
    es = ES(model, population_size=8, sigma=0.1, antithetic=antithetic, fitness_shaping="raw", noise="lowrank",
            rank=2, optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    x = torch.randn(5, 12)
    seeds = es.ask()
    f = es.forward(x).pow(2).mean(dim=(1, 2))
    est = es.estimate_gradient(f)
    for b in es.population.blocks:
        r = es.population.rank_of(b)
        n = lowrank_noise_ref(seeds, *b.param.shape, r, b.offset, antithetic) if r else \
            noise_ref(seeds, b.numel, b.offset, antithetic).view(-1, *b.param.shape)
        want = torch.einsum("p,p...->...", f.double(), n) / (8 * 0.1) * 12
        torch.testing.assert_close(est[b.name].double(), want, rtol=1e-4, atol=1e-5, msg=b.name)
    assert es.population.rank_of(es.population.blocks[0]) == 2


@pytest.mark.parametrize("antithetic", [True, False])
def test_lowrank_estimate_is_unbiased_on_linear_objective(antithetic):
    """f(theta) = c . theta: low-rank noise has covariance I / 12 as full rank, so the mean estimate is c."""
    out_f, in_f = 6, 8
    c = torch.linspace(-2, 3, out_f * in_f).view(out_f, in_f)
    module = nn.Linear(in_f, out_f, bias=False)
    with torch.no_grad():
        module.weight.zero_()
    es = ES(module, population_size=2000, sigma=0.1, antithetic=antithetic, fitness_shaping="raw", seed=7,
            noise="lowrank", rank=2)
    estimates = []
    for _ in range(40):
        es.ask()
        y = es.forward(torch.eye(in_f))  # (P, in, out): row k = column k of the perturbed weight
        f = (y.transpose(1, 2) * c).sum(dim=(1, 2))
        estimates.append(es.estimate_gradient(f)["weight"].double())
    est = torch.stack(estimates)
    mean, stderr = est.mean(0), est.std(0) / len(estimates) ** 0.5
    assert ((mean - c.double()).abs() < 5 * stderr + 1e-9).all()
    assert (stderr < 0.1).all()


def test_lowrank_checkpoint_refuses_another_noise_mode(tmp_path):
    model = nn.Sequential(nn.Linear(8, 6))
    es = ES(model, population_size=4, noise="lowrank", rank=2)
    es.save(tmp_path / "c.pt")
    with pytest.raises(ValueError, match="config"):
        ES(nn.Sequential(nn.Linear(8, 6)), population_size=4).load(tmp_path / "c.pt")
    ES(nn.Sequential(nn.Linear(8, 6)), population_size=4, noise="lowrank", rank=2).load(tmp_path / "c.pt")
