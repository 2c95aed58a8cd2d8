"""Shared MAC (hw/mac.py) against numpy: exact signed 9×9 products, packed and unpacked.

Amaranth's simulator checks the corner operands and the timing; Verilator streams the planes
``x × w0`` and ``x × w1`` exhaustively (with corner values for the third operand) and a million
random triples. Variants missing either half of the packing correction must fail the checks.
"""

import numpy as np
import pytest

from sfnpu.hw.mac import OPERAND_BITS, SharedMac
from sfnpu.tb.verilator import REPO_ROOT, VectorHarness, simulate_vectors

LATENCY = SharedMac.LATENCY
ALL_VALUES = np.arange(-(1 << OPERAND_BITS - 1), 1 << OPERAND_BITS - 1)   # -256 … 255
CORNERS = np.array([-256, -255, -1, 0, 1, 254, 255])


def corner_vectors() -> dict:
    """Every corner triple, in both modes, with ``valid`` toggling."""
    x, w0, w1, depthwise = (a.ravel() for a in np.meshgrid(CORNERS, CORNERS, CORNERS, [0, 1],
                                                           indexing="ij"))
    valid = np.arange(x.size) % 3 != 1
    return dict(x=x, w0=w0, w1=w1, depthwise=depthwise, valid=valid)


def plane_vectors(free: str, third_values) -> dict:
    """``x`` and ``free`` over the full 9-bit range, the remaining weight over ``third_values``."""
    other = "w1" if free == "w0" else "w0"
    x, free_w, third = (a.ravel() for a in np.meshgrid(ALL_VALUES, ALL_VALUES, third_values,
                                                       indexing="ij"))
    n = x.size
    return {"x": x, free: free_w, other: third, "depthwise": np.zeros(n, np.int64),
            "valid": np.ones(n, np.int64)}


def random_vectors(rng, n: int) -> dict:
    draw = lambda: rng.integers(ALL_VALUES[0], ALL_VALUES[-1] + 1, n)
    return dict(x=draw(), w0=draw(), w1=draw(), depthwise=rng.random(n) < 0.25,
                valid=rng.random(n) < 0.9)


def concat(*vector_sets) -> dict:
    return {k: np.concatenate([np.asarray(v[k], dtype=np.int64) for v in vector_sets])
            for k in vector_sets[0]}


def mismatches(vectors: dict, outputs: dict) -> dict[str, int]:
    """Scoreboard: outputs of vector k are read in cycle k + LATENCY."""
    x, w0, w1 = (np.asarray(vectors[k], dtype=np.int64) for k in ("x", "w0", "w1"))
    depthwise = np.asarray(vectors["depthwise"], dtype=bool)
    n = x.size
    got = {k: v[LATENCY:LATENCY + n] for k, v in outputs.items()}
    return {
        "p0": int(np.count_nonzero(got["p0"] != x * w0)),
        "p1": int(np.count_nonzero(got["p1"] != np.where(depthwise, 0, x * w1))),
        "p_valid": int(np.count_nonzero(got["p_valid"] != np.asarray(vectors["valid"]))),
        "p_valid before the first result": int(np.count_nonzero(outputs["p_valid"][:LATENCY])),
    }


NO_MISMATCH = {"p0": 0, "p1": 0, "p_valid": 0, "p_valid before the first result": 0}


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "separate"])
def test_corners_in_amaranth_simulator(packing):
    vectors = corner_vectors()
    outputs = simulate_vectors(SharedMac(packing), vectors, flush=LATENCY)
    assert mismatches(vectors, outputs) == NO_MISMATCH


class MacWithoutBorrow(SharedMac):
    """Packed MAC whose correction ignores the borrow of a negative low product."""

    @staticmethod
    def split_packed_product(product, w0_sign_term):
        return product[:18].as_signed(), (product[18:36] - w0_sign_term)[:18].as_signed()


class MacWithoutSignTerm(SharedMac):
    """Packed MAC whose correction ignores the missing sign extension of w0."""

    @staticmethod
    def split_packed_product(product, w0_sign_term):
        return product[:18].as_signed(), (product[18:36] + product[17])[:18].as_signed()


def uncorrected_upper_field(vectors, keep_borrow: bool, keep_sign_term: bool) -> np.ndarray:
    """numpy model of p1 when part of the correction is left out."""
    x, w0 = vectors["x"], vectors["w0"]
    w1 = np.where(vectors["depthwise"], 0, vectors["w1"])
    product = x * ((w1 << 18) + (w0 & 0x3FFFF))
    field = (product >> 18) + keep_borrow * (product >> 17 & 1) - keep_sign_term * (w0 < 0) * x
    field &= 0x3FFFF
    return np.where(field >= 1 << 17, field - (1 << 18), field)


@pytest.mark.parametrize("mutant, keeps", [(MacWithoutBorrow, (False, True)),
                                            (MacWithoutSignTerm, (True, False))],
                         ids=["no-borrow", "no-sign-term"])
def test_incomplete_correction_is_caught(mutant, keeps):
    vectors = corner_vectors()
    errors = mismatches(vectors, simulate_vectors(mutant(packing=True), vectors, flush=LATENCY))
    expected_p1 = np.where(vectors["depthwise"], 0, vectors["x"] * vectors["w1"])
    wrong = np.count_nonzero(uncorrected_upper_field(vectors, *keeps) != expected_p1)
    # Each half of the correction matters on many corner vectors, and exactly those fail.
    assert errors["p1"] == wrong > 50
    assert errors["p0"] == 0


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "separate"])
def test_exhaustive_planes_and_random_on_verilator(packing):
    rng = np.random.default_rng(20240607 + packing)
    planes = [
        plane_vectors("w0", CORNERS),          # every x·w0, w1 at each corner
        plane_vectors("w1", CORNERS),          # every x·w1, w0 at each corner
    ]
    depthwise_plane = plane_vectors("w0", [0])   # every x·w0 in single-product mode
    depthwise_plane["depthwise"][:] = 1
    depthwise_plane["w1"] = rng.integers(-256, 256, depthwise_plane["x"].size)
    random = random_vectors(rng, 1_000_000)
    vectors = concat(corner_vectors(), *planes, depthwise_plane, random)
    assert vectors["x"].size > 4_900_000

    build_dir = REPO_ROOT / "build" / "test_hw_mac" / ("packed" if packing else "separate")
    harness = VectorHarness(SharedMac(packing), "shared_mac", build_dir)
    outputs = harness.run(vectors, flush=LATENCY)
    assert mismatches(vectors, outputs) == NO_MISMATCH
