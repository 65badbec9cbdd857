# The two commands of the README:
#   make demo   the main job (trains the default task), on a fresh machine
#   make test   the test suite, on a fresh machine
# Both create .venv, install torch (CPU build) and the rest, and build the package.

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
PIP      := $(PY) -m pip
TORCH    ?= torch==2.13.0
STAMP    := $(VENV)/.deps-stamp
WHEEL_STAMP := dist/.built

.PHONY: all venv build test demo bench clean

all: test

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)" numpy "scikit-build-core>=0.10" "pybind11>=2.12" ninja pytest \
		scikit-learn tqdm matplotlib gymnasium "triton>=3.6" transformers hypothesis
	touch $@

venv: $(STAMP)

# One wheel, installed into .venv; the wheel test installs the same file into a
# second, fresh environment.
$(WHEEL_STAMP): $(STAMP) CMakeLists.txt pyproject.toml $(shell find csrc cmake python -type f)
	rm -rf dist
	$(PIP) wheel -q --no-build-isolation --no-deps . -w dist
	$(PIP) install -q --force-reinstall --no-deps dist/*.whl
	touch $@

build: $(WHEEL_STAMP)

test: build
	$(PY) -m pytest -q -ra tests

demo: build
	$(PY) -m virtual_noise train

bench: build
	$(PY) benchmarks/bench_cpu.py

clean:
	rm -rf build dist $(VENV)
