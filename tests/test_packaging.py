"""The package as users get it: wheel, optional triton, torch version guard,
an operators library without Python, and a libtorch C++ consumer."""

import glob
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import virtual_noise as vn
from virtual_noise import _library

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG_DIR = os.path.dirname(vn.__file__)


def run_python(code, env=None, python=sys.executable, check=True):
    return subprocess.run([python, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, check=check)


def test_cpu_ops_work_when_triton_import_fails():
    proc = run_python(
        """
        import sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        import torch, virtual_noise as vn
        assert vn.generate_noise(torch.tensor([0]), 1, 0).item() == 0.4970219135284424
        y = vn.virtual_perturbed_linear(torch.ones(2, 3), torch.ones(4, 3), None, torch.arange(2), 0.1, 0)
        g = vn.virtual_weight_gradient(torch.ones(2), torch.arange(2), (4, 3), 0.1, 2, 0)
        r = vn.virtual_reduce_metric(torch.ones(5), torch.arange(2), 0.1, 5, 0)
        print(tuple(y.shape), tuple(g.shape), tuple(r.shape), vn.build_info()["triton"])
        """
    )
    assert proc.stdout.split() == ["(2,", "2,", "4)", "(4,", "3)", "(2,)", "False"]


def test_cpu_only_import_does_not_load_triton():
    proc = run_python("import sys, virtual_noise; print('triton' in sys.modules)",
                      env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.stdout.strip() == "False"


# A CUDA tensor cannot exist on a CPU machine, so these tests send CPU tensors to the
# operators' CUDA kernels by redispatching to the CUDA key: what a CUDA tensor would reach.
CUDA_CALLS = """
import torch
ops = torch.ops.virtual_noise
x, w, s, f = torch.ones(2, 3), torch.ones(4, 3), torch.arange(2), torch.ones(2)
calls = {
    "perturbed_linear": (x, w, None, s, 0.1, 0, False, False),
    "perturbed_embedding": (torch.tensor([0, 3]), w, s, 0.1, 0, False),
    "lowrank_perturbed_linear": (x, w, None, s, 0.1, 0, 1, False, False),
    "lowrank_weight_gradient": (f, s, [4, 3], 0.1, 2, 0, 1, False),
    "generate_lowrank_noise": (s, [4, 3], 1, 0),
    "weight_gradient": (f, s, [4, 3], 0.1, 2, 0, False),
    "bias_gradient": (f, s, [4], 0.1, 2, 0, False),
    "reduce_metric": (w, s, 0.1, 12, 0, False),
    "generate_noise": (s, 5, 0),
}
cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
for name, args in calls.items():
    try:
        getattr(ops, name).default.redispatch(cuda, *args)
        print(name, "returned")
    except RuntimeError as e:
        print(str(e))
"""


def _assert_names_the_extra(lines, reason):
    from virtual_noise.cuda import OPS
    assert len(lines) == len(OPS)
    for name, line in zip(OPS, lines):
        assert line.startswith(f"virtual_noise.{name}: CUDA tensors need the Triton kernels"), line
        assert reason in line and "pip install 'virtual-noise[triton]'" in line, line


def test_cuda_call_without_triton_names_the_extra():
    # CUDA present, triton missing: the case the extra is for.
    proc = run_python(textwrap.dedent(
        """
        import sys, torch
        sys.modules["triton"] = None
        torch.cuda.is_available = lambda: True
        import virtual_noise
        assert not virtual_noise.build_info()["triton"]
        """) + CUDA_CALLS
    )
    _assert_names_the_extra(proc.stdout.splitlines(), "because triton is not importable")


def test_cuda_call_on_cpu_only_import_names_the_extra():
    proc = run_python("import virtual_noise\n" + CUDA_CALLS, env={"CUDA_VISIBLE_DEVICES": ""})
    _assert_names_the_extra(proc.stdout.splitlines(),
                            "because CUDA was not available when virtual_noise was imported")


def test_torch_version_guard_message():
    _library.check_torch_version("2.13.0", "2.13.1+cpu")  # same major.minor: fine
    with pytest.raises(ImportError) as info:
        _library.check_torch_version("2.13.0", "2.11.0+cu130")
    msg = str(info.value)
    assert "built against torch 2.13.0" in msg and "torch 2.11.0+cu130 is installed" in msg
    assert "pip install --no-build-isolation --no-deps --force-reinstall" in msg


def test_import_refuses_other_torch_build(tmp_path):
    # A copy of the installed package that claims another torch: import must
    # refuse cleanly before loading any binary.
    shutil.copytree(PKG_DIR, tmp_path / "virtual_noise")
    (tmp_path / "virtual_noise" / "_build_config.py").write_text('TORCH_VERSION = "1.4.0"\n')
    proc = run_python("import virtual_noise", env={"PYTHONPATH": str(tmp_path)}, check=False)
    assert proc.returncode == 1
    assert "ImportError: virtual_noise was built against torch 1.4.0" in proc.stderr
    assert f"torch {torch.__version__} is installed" in proc.stderr


def test_ops_library_has_no_python():
    lib = _library.OPS_LIBRARY_PATH
    needed = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    assert "libpython" not in needed and "libtorch_python" not in needed
    undefined = subprocess.run(["nm", "-D", "--undefined-only", lib], capture_output=True, text=True, check=True).stdout
    assert not [s for s in undefined.split() if s.startswith(("Py", "_Py"))]


def test_ops_library_shares_the_cxx_runtime():
    # A private static libstdc++ inside the library crashes on its first error
    # message (seen with one GCC toolchain); CMakeLists.txt links libtorch's.
    lib = _library.OPS_LIBRARY_PATH
    needed = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    assert "libstdc++.so.6" in needed
    defined = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    assert "codecvt" not in defined


def test_build_info():
    info = vn.build_info()
    assert info["torch_version"].split(".")[:2] == torch.__version__.split(".")[:2]
    assert info["openmp"] is True
    assert info["simd"] in {"avx512", "avx2", "baseline"}


def built_wheel(tmp_path):
    wheels = glob.glob(os.path.join(REPO, "dist", "virtual_noise-*.whl"))
    if wheels:
        return wheels[0]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", REPO,
                    "-w", str(tmp_path / "dist")], check=True)
    return glob.glob(str(tmp_path / "dist" / "*.whl"))[0]


@pytest.mark.slow
def test_wheel_installs_into_fresh_venv_with_only_torch(tmp_path):
    wheel = built_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    torch_req = f"torch=={torch.__version__.split('+')[0]}"
    subprocess.run([py, "-m", "pip", "install", "-q", torch_req], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q", wheel], check=True)
    listed = subprocess.run([py, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True).stdout
    assert "virtual_noise" in listed.replace("-", "_") and "triton" not in listed
    proc = run_python(
        """
        import torch, virtual_noise as vn
        print(vn.__file__)
        print(vn.generate_noise(torch.tensor([42]), 1, 200704).item())
        y = vn.virtual_perturbed_linear(torch.eye(3), torch.zeros(2, 3), None, torch.tensor([0]), 1.0, 0)
        print(y[0, 0, 0].item(), y[0, 1, 0].item())
        """,
        python=py, env={"PYTHONPATH": ""},
    )
    lines = proc.stdout.split()
    assert lines[0].startswith(str(venv))
    assert float(lines[1]) == 0.05290186405181885
    # Y[0][k, j] = N_0[j, k]: element (0,0) is noise(0,0), element (1,0) is noise(0,1).
    assert [float(v) for v in lines[2:]] == [0.4970219135284424, -0.1988297700881958]


@pytest.mark.slow
def test_cpp_consumer_builds_and_runs(tmp_path):
    from test_torch_integration import ScriptedPopulationLinear

    module = torch.jit.script(ScriptedPopulationLinear())
    module.save(str(tmp_path / "module.pt"))
    prefix = f"{torch.utils.cmake_prefix_path};{vn.cmake_prefix_path}"
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", os.path.join(REPO, "examples", "cpp"), "-B", str(build),
                    f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"], check=True,
                   capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j2"], check=True, capture_output=True)
    proc = subprocess.run([str(build / "vn_consumer"), str(tmp_path / "module.pt")], capture_output=True,
                          text=True, check=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    out = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert [float(v) for v in out["noise"].split()] == [0.4970219135284424, -0.1988297700881958, 0.010754883289337158]
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10.0
    want = module(x, torch.tensor([5, 6]))
    got_sum, _, shape = out["module_sum"].split(" ", 2)
    assert shape == "[2, 3, 2]"
    assert abs(float(got_sum) - want.sum().item()) < 1e-4
    assert "virtual_noise.weight_gradient: `fitness` must have pop_size = 3" not in out["error"]
    assert "virtual_noise.weight_gradient: `pop_size` must equal len(seeds) = 2; got 3" in out["error"]
