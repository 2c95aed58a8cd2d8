"""Generated documentation and C headers are current, and the C header agrees with Python."""

import shutil
import struct
import subprocess
from pathlib import Path

from sfnpu import docs, image

ROOT = Path(__file__).resolve().parents[1]


def test_committed_generated_files_are_current():
    stale = docs.stale(ROOT)
    assert not stale, f"stale generated files {stale}: run `make docs` and commit"


def test_staleness_is_detected(tmp_path):
    assert docs.write(tmp_path) == list(docs.GENERATED)
    assert docs.stale(tmp_path) == [] and docs.write(tmp_path) == []
    target = tmp_path / "docs/isa.md"
    target.write_text(target.read_text().replace("| 0 | 3:0 | `opcode`", "| 0 | 3:0 | `opc`"))
    assert docs.stale(tmp_path) == ["docs/isa.md"]
    (tmp_path / "firmware/include/sfnpu_image.h").unlink()
    assert docs.stale(tmp_path) == ["docs/isa.md", "firmware/include/sfnpu_image.h"]


def test_isa_doc_lists_every_field():
    text = docs.render_all()["docs/isa.md"]
    from sfnpu import isa
    for f in isa.field_table():
        assert f"`{f.name}`" in text


def test_c_header_layout_matches_python(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to check the generated firmware header"
    fields = lambda fs: [n for n, f, _ in fs if not f.endswith("x")]
    prints = []
    for struct_name, fs in (("sfnpu_image_header_t", image.HEADER_FIELDS),
                            ("sfnpu_image_section_t", image.SECTION_FIELDS)):
        prints.append(f'printf("%zu\\n", sizeof({struct_name}));')
        prints += [f'printf("%zu\\n", offsetof({struct_name}, {n}));' for n in fields(fs)]
    src = tmp_path / "check.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"sfnpu_image.h\"\n"
                   "int main(void) {\n" + "\n".join(prints) + "\nreturn 0; }\n")
    exe = tmp_path / "check"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", str(ROOT / "firmware/include"),
                    str(src), "-o", str(exe)], check=True)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True,
                                          check=True).stdout.split()]
    expect = []
    for fs in (image.HEADER_FIELDS, image.SECTION_FIELDS):
        expect.append(struct.calcsize("<" + "".join(f for _, f, _ in fs)))
        offset = 0
        for n, f, _ in fs:
            if not f.endswith("x"):
                expect.append(offset)
            offset += struct.calcsize("<" + f)
    assert got == expect
