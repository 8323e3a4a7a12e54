PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# onnxruntime-openvino is its own ONNX Runtime build and clashes with the CPU wheel, so it lives in
# its own environment; ortprep load --runtime openvino-cpu=$(OPENVINO_VENV)/bin/python reaches it.
OPENVINO_VENV := .venv-openvino
# AIMET-ONNX (quantize --engine aimet) needs torch, about 2 GB with its dependencies: its own environment,
# reached by the engine's worker (docs/install.md). torch==2.13.0 resolves to the CPU wheel where a local
# wheel dir holds it; elsewhere pass AIMET_PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu'
# (plain PyPI's torch is the CUDA build).
AIMET_VENV := .venv-aimet
AIMET_PIP_ARGS ?=

.PHONY: install test samples bench fuzz clean

install:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[cpu,qnn,dev,nncf]'
	# real models from PyPI wheels for the tests (tests/test_real_models.py): the wheel only, no dependencies
	$(BIN)/python -m pip download --quiet --no-deps --dest .wheels rapidocr==3.10.0 faster-whisper==1.2.1 silero-vad==6.2.1
	# a browser for tests/test_html_browser.py: the system's Chromium (Debian's package where we are root), else
	# Playwright's download; without one those tests skip, and install goes on (each try bounded in time)
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
		|| { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && timeout 300 apt-get update -q >/dev/null \
		     && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q chromium >/dev/null; } \
		|| timeout 300 $(BIN)/python -m playwright install chromium \
		|| echo "no Chromium: the browser tests of the HTML pages will skip"
	$(PYTHON) -m venv $(OPENVINO_VENV)
	$(OPENVINO_VENV)/bin/python -m pip install --quiet onnxruntime-openvino numpy
	$(PYTHON) -m venv $(AIMET_VENV)
	$(AIMET_VENV)/bin/python -m pip install --quiet $(AIMET_PIP_ARGS) torch==2.13.0 aimet-onnx==2.42.0 onnxruntime numpy onnx

test:
	$(BIN)/ruff check --quiet ortprep tests bench tools sample_models
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q --durations=30

samples:
	$(BIN)/python sample_models/build.py

bench:
	$(BIN)/python -m bench.suite.run_all

# protobuf-field mutations (2,000 cases); the byte flips of before: tools/fuzz.py --mode bytes
fuzz:
	nice -n 5 $(BIN)/python tools/fuzz.py --mode fields --cases 2000

clean:
	rm -rf $(VENV) $(OPENVINO_VENV) $(AIMET_VENV) build *.egg-info
