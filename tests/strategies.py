"""Hypothesis strategies for valid group instructions (every field and enum value reachable)."""

from hypothesis import strategies as st

from sfnpu import isa
from sfnpu.numeric import pool_output_size
from sfnpu.isa import Activation, ActOrder, ConvKind, Eltwise, InputTransform, MemSpace, Pool


def _conv_out(size, pad_a, pad_b, k, s):
    return (size + pad_a + pad_b - k) // s + 1


def _pool_out(size, k, s, p, ceil):
    return pool_output_size(size, k, s, p, p, ceil)


locations = st.builds(lambda space, offset: isa.Location(space=space, offset=offset),
                      st.sampled_from(MemSpace), st.integers(0, (1 << 30) - 1))
dram_locations = st.integers(0, (1 << 30) - 1).map(isa.dram)


@st.composite
def zero_point(draw, signed):
    return draw(st.integers(-128, 127) if signed else st.integers(0, 255))


@st.composite
def instructions(draw, last=None):
    f = {}
    conv = f["conv"] = draw(st.sampled_from(ConvKind))
    in_c = f["in_c"] = draw(st.integers(1, 0xFFFF))
    f["out_c"] = draw(st.integers(1, 0xFFFF)) if conv == ConvKind.NORMAL else in_c
    f["out_c_offset"] = draw(st.integers(0, 0xFFFF - f["out_c"]))
    if conv == ConvKind.NONE:
        k = dict(kh=1, kw=1, sh=1, sw=1, pad_top=0, pad_left=0, pad_bottom=0, pad_right=0)
    else:
        kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
        k = dict(kh=kh, kw=kw, sh=draw(st.integers(1, 2)), sw=draw(st.integers(1, 2)),
                 pad_top=draw(st.integers(0, kh - 1)), pad_bottom=draw(st.integers(0, kh - 1)),
                 pad_left=draw(st.integers(0, kw - 1)), pad_right=draw(st.integers(0, kw - 1)))
        f["weights"] = draw(dram_locations)
        f["in_transform"] = draw(st.sampled_from(InputTransform))
    f.update(k)

    pool = f["pool"] = draw(st.sampled_from(Pool))
    if pool in (Pool.MAX, Pool.AVG):
        f["pool_size"] = draw(st.integers(2, 3))
        f["pool_stride"] = draw(st.integers(1, 2))
        f["pool_pad"] = draw(st.integers(0, f["pool_size"] - 1))
        f["pool_count_pad"] = draw(st.integers(0, 1)) if pool == Pool.AVG else 0
    f["upsample"] = 0 if pool == Pool.GLOBAL_AVG else draw(st.integers(0, 1))

    def axis(name, pad_a, pad_b, k, s):
        # Smallest input that leaves at least one output after conv and pooling.
        need = max(k - pad_a - pad_b, 1) + (3 * s if pool in (Pool.MAX, Pool.AVG) else 0)
        # Padding and ceil-mode pooling can grow an axis by up to 15; keep the output in 12 bits.
        size = draw(st.integers(need, 2030 if f["upsample"] else 4080))
        out = _conv_out(size, pad_a, pad_b, k, s)
        if pool in (Pool.MAX, Pool.AVG):
            out = _pool_out(out, f["pool_size"], f["pool_stride"], f["pool_pad"],
                            draw(st.booleans()))
        elif pool == Pool.GLOBAL_AVG:
            out = 1
        return size, out * (2 if f["upsample"] else 1)
    f["in_h"], f["out_h"] = axis("h", k["pad_top"], k["pad_bottom"], k["kh"], k["sh"])
    f["in_w"], f["out_w"] = axis("w", k["pad_left"], k["pad_right"], k["kw"], k["sw"])

    for t in ("in", "out"):
        f[f"{t}_signed"] = draw(st.integers(0, 1))
        f[f"{t}_zp"] = draw(zero_point(f[f"{t}_signed"]))
    act = f["act"] = draw(st.sampled_from(Activation))
    if act == Activation.CLAMP:
        lo, hi = sorted((draw(zero_point(f["out_signed"])), draw(zero_point(f["out_signed"]))))
        f["clamp_lo"], f["clamp_hi"] = lo, hi
    elt = f["eltwise"] = draw(st.sampled_from(Eltwise))
    if elt != Eltwise.NONE:
        f["sc_signed"] = draw(st.integers(0, 1))
        f["sc_zp"] = draw(zero_point(f["sc_signed"]))
        f["shortcut"] = draw(locations)
        f["act_order"] = draw(st.sampled_from(ActOrder))
    f["reuse"] = draw(st.sampled_from(isa.Reuse))
    f["last"] = draw(st.integers(0, 1)) if last is None else int(last)
    f["input"], f["output"] = draw(locations), draw(locations)
    if elt != Eltwise.NONE and f["shortcut"].space == f["input"].space != MemSpace.DRAM:
        f["shortcut"] = isa.dram(f["shortcut"].offset)      # one read port per buffer
    f["params"] = draw(dram_locations)
    return isa.Instruction(**f)


@st.composite
def programs(draw, max_groups=6):
    n = draw(st.integers(1, max_groups))
    return [draw(instructions(last=(i == n - 1))) for i in range(n)]
