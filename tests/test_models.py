"""Any nn.Module as a population: exactness against torch.func.functional_call with explicitly
perturbed parameters, the noise layout, evolve, outputs, generation, and the errors."""

import copy

import pytest
import torch
from model_zoo import ZOO, hf_gpt2, hf_llama, init_nonzero_
from reference import assert_population_close, noise_ref, population_reference
from torch import nn

import virtual_noise as vn
from virtual_noise.models import REGISTRY, PopulationError, VirtualPopulation

TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (5e-2, 5e-2), torch.float16: (1e-2, 1e-2)}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def build(name, g, dtype=torch.float32, device="cpu"):
    cls, inputs = ZOO[name]
    torch.manual_seed(0)
    model = init_nonzero_(cls(), g).to(dtype).eval().to(device)
    args, kwargs = inputs(g)
    args = tuple((a.to(dtype) if a.is_floating_point() else a).to(device) for a in args)
    return model, args, kwargs


def tolerance(dtype, device):
    """On CUDA the float32 noise term runs at tf32 (docs/precision.md); 16-bit models there round the
    perturbed weight differently from the reference (W and the noise term apart, against W + sigma N
    rounded once), which a CNN's two 16-bit layers grow to ~0.1 in a few outputs (bf16, H100)."""
    if device == "cuda" and dtype == torch.float32:
        return 5e-3, 5e-3
    if device == "cuda" and dtype == torch.bfloat16:
        return 5e-2, 1.5e-1
    return TOL[dtype]


def per_individual_inputs(args, P, g):
    """P different copies of each input (fresh random floats, shuffled ids)."""
    out = []
    for a in args:
        if a.is_floating_point():
            out.append(torch.randn((P, *a.shape), generator=g).to(a.dtype))
        elif a.dtype == torch.bool:
            out.append(a.expand(P, *a.shape).clone())
        else:
            out.append(torch.stack([a[..., torch.randperm(a.shape[-1], generator=g)] for _ in range(P)]))
    return tuple(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(ZOO))
@pytest.mark.parametrize("antithetic", [True, False])
@pytest.mark.parametrize("per_individual", [False, True])
def test_population_matches_functional_call(name, antithetic, per_individual, device, gen):
    model, args, kwargs = build(name, gen, device=device)
    seeds = torch.randint(-(2**63), 2**63 - 1, (3,), generator=gen)
    P = 6 if antithetic else 3
    if per_individual:
        args = tuple(a.to(device) for a in per_individual_inputs(tuple(a.cpu() for a in args), P, gen))
    pop = VirtualPopulation(model)
    out = pop(*args, seeds=seeds, sigma=0.05, antithetic=antithetic, per_individual=per_individual, **kwargs)
    refs = population_reference(model, args, kwargs, seeds, 0.05, antithetic, per_individual)
    assert_population_close(out, refs, *tolerance(torch.float32, device))
    center = model(*(a[0] for a in args) if per_individual else args, **kwargs)
    first = out[0] if isinstance(out, tuple) else out["out"] if isinstance(out, dict) else out
    c = center[0] if isinstance(center, tuple) else center["out"] if isinstance(center, dict) else center
    assert not torch.allclose(first[0], c, atol=1e-4)  # the noise is there


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["cnn", "resblock"])
@pytest.mark.parametrize("per_individual", [False, True])
def test_large_convolutions_take_the_unfold_path(name, per_individual, device, gen, monkeypatch):
    """Convolutions whose population weights exceed MATERIALIZE_BYTES never store them: unfold + the fused
    linear, one call per group (forced here on small models)."""
    from virtual_noise.models.adapters import conv

    monkeypatch.setattr(conv, "MATERIALIZE_BYTES", 0)
    called = []
    monkeypatch.setattr(conv, "_grouped", lambda *a: called.append(1))
    model, args, kwargs = build(name, gen, device=device)
    seeds = torch.tensor([5, -6])
    if per_individual:
        args = tuple(a.to(device) for a in per_individual_inputs(tuple(a.cpu() for a in args), 4, gen))
    out = VirtualPopulation(model)(*args, seeds=seeds, sigma=0.05, per_individual=per_individual, **kwargs)
    refs = population_reference(model, args, kwargs, seeds, 0.05, True, per_individual)
    assert_population_close(out, refs, *tolerance(torch.float32, device))
    assert not called


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gpt", "cnn", "attention", "rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_population_16bit(name, dtype, device, gen):
    model, args, kwargs = build(name, gen, dtype, device)
    seeds = torch.tensor([7, -7])
    out = VirtualPopulation(model)(*args, seeds=seeds, sigma=0.05, **kwargs)
    refs = population_reference(model, args, kwargs, seeds, 0.05, True)
    assert_population_close(out, refs, *tolerance(dtype, device))
    first = out[0] if isinstance(out, tuple) else out["out"] if isinstance(out, dict) else out
    ref = torch.stack([r[0] if isinstance(r, tuple) else r["out"] if isinstance(r, dict) else r for r in refs])
    err = (first.double() - ref.double()).abs().mean() / ref.double().abs().mean()
    assert err < 0.01  # on average, within a 16-bit rounding or two


def test_layout_follows_named_parameters_and_compute_offsets():
    model = ZOO["gpt"][0]()
    pop = VirtualPopulation(model)
    named = list(model.named_parameters())  # the tied head weight appears once, as tok.weight
    assert [b.name for b in pop.blocks] == [n for n, _ in named]
    assert [b.offset for b in pop.blocks] == vn.compute_offsets([p.shape for _, p in named])
    assert "head.weight" not in [b.name for b in pop.blocks]
    kinds = {type(m).__name__ for m, _ in pop._patches}
    assert {"Embedding", "Linear"} <= kinds
    assert {b.name for b in pop.materialized_blocks} == {n for n, _ in named if "ln" in n}


def test_nn_linear_layout_is_the_operators():
    """A Linear model's population output is exactly the fused operator's at the layout's offsets."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    x, seeds = torch.randn(4, 6), torch.tensor([3, 4])
    y = VirtualPopulation(model)(x, seeds=seeds, sigma=0.2)
    h = torch.tanh(vn.virtual_perturbed_linear(x, model[0].weight, model[0].bias, seeds, 0.2, 0, antithetic=True))
    want = vn.virtual_perturbed_linear(h, model[2].weight, model[2].bias, seeds, 0.2, 35, antithetic=True)
    assert torch.equal(y, want)


def test_older_call_form_still_works(gen):
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    seeds = torch.tensor([11, -4])
    pop = VirtualPopulation(model)
    x = torch.randn(5, 6, generator=gen)
    assert torch.equal(pop(x, seeds, 0.2, True), pop(x, seeds=seeds, sigma=0.2))
    xp = torch.randn(4, 5, 6, generator=gen)  # 3-D: per individual, as before
    assert torch.equal(pop(xp, seeds, 0.2), pop(xp, seeds=seeds, sigma=0.2, per_individual=True))
    with pytest.raises(TypeError, match="pass the population as keywords"):
        pop(x)


def test_evolve_selects_blocks_and_frozen_parameters_take_no_noise(gen):
    model, args, kwargs = build("gpt", gen)
    last = lambda n, p: n.startswith("blocks.1.")  # noqa: E731  fine-tune the last block only
    pop = VirtualPopulation(model, evolve=last)
    assert all(b.name.startswith("blocks.1.") for b in pop.blocks)
    assert pop.blocks[0].offset == 0 and pop.n_params == sum(p.numel() for n, p in model.named_parameters() if last(n, p))
    seeds = torch.tensor([5, 6])
    out = pop(*args, seeds=seeds, sigma=0.1, **kwargs)
    assert_population_close(out, population_reference(model, args, kwargs, seeds, 0.1, True, evolve=last),
                            *TOL[torch.float32])
    names = ["blocks.0.qkv.weight", "ln_f.bias", "head.weight"]  # an alias of a tied parameter selects it
    pop2 = VirtualPopulation(model, evolve=names)
    assert [b.name for b in pop2.blocks] == ["tok.weight", "blocks.0.qkv.weight", "ln_f.bias"]
    with pytest.raises(ValueError, match=r"`evolve` names parameters the model does not have: 'nope'"):
        VirtualPopulation(model, evolve=["nope"])
    with pytest.raises(TypeError, match="got the string"):
        VirtualPopulation(model, evolve="tok.weight")


def test_requires_grad_false_is_frozen_by_default():
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    model[0].weight.requires_grad_(False)
    pop = VirtualPopulation(model)
    assert [b.name for b in pop.blocks] == ["0.bias", "1.weight", "1.bias"]
    x, seeds = torch.randn(2, 3), torch.tensor([1])
    out = pop(x, seeds=seeds, sigma=0.3)
    refs = population_reference(model, (x,), {}, seeds, 0.3, True)
    assert_population_close(out, refs, *TOL[torch.float32])


def test_output_structures(gen):
    class Out(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(3, 2)

        def forward(self, x, scale=1.0):
            y = self.l(x) * scale
            return {"y": y, "pair": (y, y.sum(-1)), "n": 3}

    model, x, seeds = Out(), torch.randn(4, 3, generator=gen), torch.tensor([9])
    out = VirtualPopulation(model)(x, seeds=seeds, sigma=0.1, scale=2.0)
    assert out["n"] == 3 and out["y"].shape == (2, 4, 2) and out["pair"][1].shape == (2, 4)
    assert_population_close(out, population_reference(model, (x,), {"scale": 2.0}, seeds, 0.1, True),
                            *TOL[torch.float32])


def test_never_a_population_copy_of_a_large_parameter(gen):
    """No tensor made during the call is as large as P copies of the fused weights."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        biggest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.biggest = max(Largest.biggest, t.numel())
            return out

    model = nn.Sequential(nn.Embedding(1000, 64), nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 64), nn.LayerNorm(64))
    ids, seeds = torch.randint(0, 1000, (2, 3), generator=gen), torch.arange(16)
    with Largest():
        VirtualPopulation(model)(ids, seeds=seeds, sigma=0.1)
    P = 32
    assert Largest.biggest < P * 64 * 512 / 8  # activations and small noise only: P x 2 x 3 x 512 here


def test_hf_style_generation_requires_a_cache():
    with pytest.raises(TypeError, match="needs a Hugging Face causal language model"):
        VirtualPopulation(nn.Linear(2, 2)).generate(torch.zeros(1, 2, dtype=torch.long), seeds=torch.tensor([1]),
                                                    sigma=0.1, max_new_tokens=2)


# -- errors ----------------------------------------------------------------------------------------

class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(3, 3)
        self.gate = Gate()

    def forward(self, x):
        return self.gate(self.l(x))


class Gate(nn.Module):
    def forward(self, h):
        return h if h.sum() > 0 else -h


class RawUse(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)

    def forward(self, i):
        return self.emb(i) @ self.emb.weight.T  # the weight outside its layer


@pytest.mark.parametrize("model,x,match", [
    (Branchy(), torch.randn(2, 3), r"module 'gate' \(Gate\) cannot run batched.*branches in Python"),
    (nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)).train(), torch.randn(2, 3),
     r"module '1' \(Dropout\).*random numbers.*model.eval\(\)"),
    (nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)).train(), torch.randn(2, 1, 5, 5),
     r"module '1' \(BatchNorm2d\) is in training mode.*model.eval\(\)"),
    (RawUse(), torch.tensor([1, 2]), r"parameter 'emb.weight' is perturbed by its layer.*\(Tensor.T\)"),
    (nn.Sequential(nn.Embedding(5, 2, max_norm=1.0)), torch.tensor([1]), r"max_norm=1.0"),
])
def test_unbatchable_models_are_named(model, x, match):
    with pytest.raises((PopulationError, RuntimeError, ValueError), match=match):
        VirtualPopulation(model)(x, seeds=torch.tensor([1, 2]), sigma=0.1)


def test_batchnorm_in_eval_mode_works(gen):
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)).eval()
    x, seeds = torch.randn(2, 1, 5, 5, generator=gen), torch.tensor([3])
    assert_population_close(VirtualPopulation(model)(x, seeds=seeds, sigma=0.1),
                            population_reference(model, (x,), {}, seeds, 0.1, True), *TOL[torch.float32])


def test_large_parameter_without_a_fused_layer_is_named():
    class Raw(nn.Module):
        def __init__(self):
            super().__init__()
            self.W = nn.Parameter(torch.zeros(64, 40))

    with pytest.raises(ValueError, match=r"parameter 'W' \(\(64, 40\), 2,560 elements, in Raw '<root>'\) has no "
                                         r"fused.*max_materialized = 1,000 elements.*nn.Linear"):
        VirtualPopulation(Raw(), max_materialized=1000)
    VirtualPopulation(Raw(), max_materialized=4096)  # within the limit: materialized


def test_per_individual_by_name_and_position(gen):
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(3, 2)

        def forward(self, a, b, scale):
            return self.l(a) * scale + b

    model, seeds = Two(), torch.tensor([4, 5])
    a, b, scale = torch.randn(4, 2, 3, generator=gen), torch.randn(2, 2, generator=gen), torch.randn(4, 1, generator=gen)
    out = VirtualPopulation(model)(a, b, scale=scale, seeds=seeds, sigma=0.1, per_individual=[0, "scale"])
    refs = [population_reference(model, (a[i], b), {"scale": scale[i]}, seeds, 0.1, True)[i] for i in range(4)]
    assert_population_close(out, refs, *TOL[torch.float32])


def test_per_individual_inputs_need_the_population_dim():
    pop = VirtualPopulation(nn.Linear(3, 2))
    with pytest.raises(ValueError, match=r"leading population dim of 4; got one of shape \(3, 3\)"):
        pop(torch.randn(3, 3), seeds=torch.tensor([1, 2]), sigma=0.1, per_individual=True)
    with pytest.raises(TypeError, match="`seeds` must be a 1-D integer tensor"):
        pop(torch.randn(3, 3), seeds=torch.tensor([1.0]), sigma=0.1)


def test_subclass_with_own_forward_is_not_taken_for_its_base():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = Scaled(3, 2)
    pop = VirtualPopulation(model)
    assert pop._patches == [] and len(pop.materialized_blocks) == 2  # small: materialized, its forward kept
    x, seeds = torch.randn(4, 3), torch.tensor([5])
    assert_population_close(pop(x, seeds=seeds, sigma=0.1), population_reference(model, (x,), {}, seeds, 0.1, True),
                            *TOL[torch.float32])


def test_registry_lists_every_adapter():
    assert [a.name for a in REGISTRY] == ["nn.Linear", "transformers Conv1D", "nn.Conv1d, nn.Conv2d", "nn.Embedding",
                                          "nn.MultiheadAttention"]


# -- Hugging Face ------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [hf_gpt2, hf_llama], ids=["gpt2", "llama"])
@pytest.mark.parametrize("per_individual", [False, True])
def test_hugging_face_forward(make, per_individual, device, gen):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = make().to(device)
    ids = torch.randint(3, 64, (2, 7), generator=gen).to(device)
    mask = torch.ones(2, 7, dtype=torch.long, device=device)
    mask[0, :2] = 0  # left padding
    seeds = torch.tensor([4, 2**40])
    pop = VirtualPopulation(model)
    assert any(type(m).__name__ in ("Conv1D", "Linear") for m, _ in pop._patches)
    if per_individual:  # the mask stays shared: Hugging Face models branch on its values
        ids = torch.stack([ids.roll(i, -1) for i in range(4)])
        out = pop(input_ids=ids, attention_mask=mask, seeds=seeds, sigma=0.05, per_individual=["input_ids"])
        refs = [population_reference(model, (ids[i],), {"attention_mask": mask, "use_cache": False}, seeds, 0.05,
                                     True)[i] for i in range(4)]
    else:
        out = pop(ids, attention_mask=mask, seeds=seeds, sigma=0.05)
        refs = population_reference(model, (ids,), {"attention_mask": mask, "use_cache": False}, seeds, 0.05, True)
    assert out.logits.shape == (4, 2, 7, 64)
    tol = 1e-4 if device == "cpu" else 1e-2
    torch.testing.assert_close(out.logits, torch.stack([r.logits for r in refs]), rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [hf_gpt2, hf_llama], ids=["gpt2", "llama"])
def test_hugging_face_generate_matches_each_individuals_generate(make, device, gen):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = make().to(device)
    ids = torch.randint(3, 64, (2, 6), generator=gen).to(device)
    mask = torch.ones(2, 6, dtype=torch.long, device=device)
    mask[1, :3] = 0
    seeds = torch.tensor([8, -8])
    pop = VirtualPopulation(model)
    out = pop.generate(ids, mask, seeds=seeds, sigma=0.05, max_new_tokens=6, pad_token_id=0)
    assert out.shape == (4, 2, 12) and torch.equal(out[:, :, :6], ids.expand(4, -1, -1))
    noise = noise_ref(seeds, pop.n_params, 0, True).float()
    for i in range(4):
        mi = copy.deepcopy(model)
        with torch.no_grad():
            for b in pop.blocks:
                d = noise[i, b.offset:b.offset + b.numel].view(b.param.shape).to(device)
                dict(mi.named_parameters())[b.name].add_(0.05 * d)
        want = mi.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(out[i], want), (i, out[i], want)
    assert not all(torch.equal(out[0], out[i]) for i in range(1, 4))  # individuals differ
