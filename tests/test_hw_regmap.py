# amaranth: UnusedElaboratable=no
"""The register map (sfnpu/regmap.py): consistent, rendered into a C header that a C compiler
agrees with, and the one source of the enums the RTL carries."""

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from amaranth.hdl import Shape

from sfnpu import docs, regmap
from sfnpu.config import get_config
from sfnpu.hw.csr import ControlSignature, CsrBlock
from sfnpu.hw.dma import DmaEngine
from sfnpu.regmap import Access, ErrorCode, StallCause

ROOT = Path(__file__).resolve().parents[1]
HEADER = "firmware/include/sfnpu_regs.h"


def test_generated_files_are_registered_and_current():
    assert {"docs/registers.md", HEADER} <= set(docs.GENERATED)
    assert docs.stale(ROOT) == [], "run `make docs`"


def test_map_is_consistent_and_the_check_can_fail():
    regmap.check()
    first = regmap.REGISTERS[0]
    control = regmap.register("CONTROL")
    broken = {
        "reused offset": (*regmap.REGISTERS, replace(control, name="X", offset=first.offset)),
        "overlap": (replace(control, fields=control.fields + (
            regmap.Field("clash", 1, 2, Access.RW, "overlaps soft_reset"),)),),
        "too wide": (replace(control, fields=(
            regmap.Field("wide", 30, 4, Access.RW, "past bit 31"),)),),
        "reset": (replace(control, fields=(
            regmap.Field("small", 0, 2, Access.RW, "reset too big", reset=4),)),),
    }
    for reason, registers in broken.items():
        with pytest.raises(ValueError):
            regmap.check(registers)
    assert regmap.by_offset(0x20) is control and regmap.by_offset(0x1C) is None


def test_wide_values_are_adjacent_pairs():
    wide = regmap.wide_registers()
    assert {"IMAGE_BASE", "DMA_WINDOW_BASE", "DMA_WINDOW_LIMIT", "CYCLES", "DRAM_READ_BYTES",
            "DRAM_WRITE_BYTES", "FINGERPRINT"} <= set(wide)
    assert {f"STALL_{c.name}" for c in StallCause} <= set(wide)
    for lo, hi in wide.values():
        assert hi.offset == lo.offset + 4 and lo.latched == hi.latched
    assert all(lo.latched for name, (lo, _) in wide.items()
               if name in ("CYCLES", "DRAM_READ_BYTES") or name.startswith("STALL_"))


def test_reset_values_resolve_hardware_parameters():
    config = get_config("kcu1500")
    csr = CsrBlock(config, group_log_depth=128)
    lo = regmap.reset_value(regmap.register("FINGERPRINT_LO"), csr.parameters)
    hi = regmap.reset_value(regmap.register("FINGERPRINT_HI"), csr.parameters)
    assert hi << 32 | lo == config.fingerprint
    with pytest.raises(KeyError):
        regmap.reset_value(regmap.register("GROUP_LOG_DEPTH"))
    assert regmap.reset_value(regmap.register("ID")) == int.from_bytes(b"SFNP", "little")


def test_rtl_carries_the_shared_enums():
    """Gateware and host use one ErrorCode: the CSR's input and the DMA's output are shaped by
    it, and the register field is declared with it."""
    config = get_config("ecp5")
    assert ControlSignature(4).members["error_code"].shape is ErrorCode
    assert DmaEngine(config).signature.members["error_code"].shape is ErrorCode
    assert regmap.register("ERROR_CODE").field("code").enum is ErrorCode
    assert Shape.cast(ControlSignature(4).members["stall"].shape).width == len(StallCause)


def test_documentation_lists_every_register_field_and_code():
    text = docs.render_all()["docs/registers.md"]
    for reg in regmap.REGISTERS:
        assert f"`{reg.name}`" in text and f"`{reg.offset:#05x}`" in text
        for f in reg.fields:
            assert f"`{f.name}`" in text or f.name == reg.name.lower()
    for code in ErrorCode:
        assert f"| {code.value} | `{code.name}` |" in text


def test_c_header_agrees_with_python(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to check the generated firmware header"
    checks = [("SFNPU_ID_MAGIC", regmap.MAGIC), ("SFNPU_REGMAP_VERSION", regmap.REGMAP_VERSION)]
    checks += [(f"SFNPU_REG_{r.name}", r.offset) for r in regmap.REGISTERS]
    for r in regmap.REGISTERS:
        if len(r.fields) == 1 and r.fields[0].width == 32:
            continue
        for f in r.fields:
            stem = f"SFNPU_{r.name}_{f.name.upper()}"
            checks += [(f"{stem}_SHIFT", f.lsb), (f"{stem}_MASK", f.mask)]
    checks += [(f"SFNPU_ERROR_{c.name}", c.value) for c in ErrorCode]
    checks += [(f"SFNPU_STALL_{c.name}", c.value) for c in StallCause]
    # sfnpu_read64 reads LO (offset) first, then HI (offset + 4).
    checks.append(("sfnpu_read64(fake, SFNPU_REG_CYCLES_LO)", 0x1122334455667788))
    cycles = regmap.register("CYCLES_LO").offset // 4
    src = tmp_path / "check.c"
    src.write_text(
        "#include <stdio.h>\n#include \"sfnpu_regs.h\"\n"
        f"static uint32_t fake[64];\nint main(void) {{\n"
        f"fake[{cycles}] = 0x55667788u; fake[{cycles + 1}] = 0x11223344u;\n"
        + "".join(f'printf("%llu\\n", (unsigned long long)({expr}));\n' for expr, _ in checks)
        + "return 0; }\n")
    exe = tmp_path / "check"
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic",
                    "-I", str(ROOT / "firmware/include"), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert [int(x) for x in out] == [value for _, value in checks]


def test_rendered_header_changes_with_the_map(monkeypatch):
    """The header is derived, not copied: moving a register moves its macro."""
    moved = tuple(replace(r, offset=0xF0) if r.name == "GROUP_LOG_DATA" else r
                  for r in regmap.REGISTERS)
    monkeypatch.setattr(regmap, "REGISTERS", moved)
    assert "#define SFNPU_REG_GROUP_LOG_DATA         0x0f0u" in regmap.render_c_header("x")
