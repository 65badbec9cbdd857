"""10,000 calls of every operator: resident memory stays flat (no leak in the kernels, the checks or the
Python wrappers)."""

import subprocess
import sys
import textwrap

SOAK = textwrap.dedent(
    """
    import json, sys, torch, virtual_noise as vn

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    g = torch.Generator().manual_seed(0)
    s = torch.randint(0, 2**40, (8,), generator=g)
    x, xp = torch.randn(4, 32, generator=g), torch.randn(16, 4, 32, generator=g)
    w, b, f = torch.randn(24, 32, generator=g), torch.randn(24, generator=g), torch.randn(16, generator=g)
    idx = torch.randint(0, 24, (6,), generator=g)
    calls = {
        "perturbed_linear": lambda: vn.virtual_perturbed_linear(xp, w, b, s, 0.1, 3, antithetic=True),
        "perturbed_linear transposed": lambda: vn.virtual_perturbed_linear(x, w.t(), b, s, 0.1, 3, transposed=True),
        "perturbed_embedding": lambda: vn.virtual_perturbed_embedding(idx, w, s, 0.1, 3, antithetic=True),
        "weight_gradient": lambda: vn.virtual_weight_gradient(f, s, (24, 32), 0.1, 16, 3, antithetic=True),
        "bias_gradient": lambda: vn.virtual_bias_gradient(f[:8], s, (24,), 0.1, 8, 3),
        "reduce_metric": lambda: vn.virtual_reduce_metric(w, s, 0.1, w.numel(), 3),
        "generate_noise": lambda: vn.generate_noise(s, 300, 3),
        "lowrank_perturbed_linear": lambda: vn.virtual_lowrank_perturbed_linear(xp, w, b, s, 0.1, 3, 4,
                                                                                antithetic=True),
        "lowrank_weight_gradient": lambda: vn.virtual_lowrank_weight_gradient(f, s, (24, 32), 0.1, 16, 3, 4,
                                                                              antithetic=True),
        "generate_lowrank_noise": lambda: vn.generate_lowrank_noise(s, (24, 32), 4, 3),
        "an error path": lambda: vn.virtual_perturbed_linear(x, w[:, :5], b, s, 0.1, 3),
    }
    growth = {}
    for name, fn in calls.items():
        def call():
            try:
                fn()
            except ValueError:
                pass
        for _ in range(500):
            call()
        before = rss()
        for _ in range(10_000):
            call()
        growth[name] = rss() - before
    print(json.dumps(growth))
    """
)


def test_ten_thousand_calls_of_every_operator_keep_memory_flat():
    proc = subprocess.run([sys.executable, "-c", SOAK], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    growth = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(growth) == 11
    for name, grew in growth.items():  # 10,000 calls: even 200 bytes leaked per call would show as 2 MB
        assert grew < 1 << 20, (name, grew)
