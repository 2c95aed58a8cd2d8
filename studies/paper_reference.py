"""Published figures the compiler's optimizations are compared with — quoted as reference data,
in one place.

Source: D. T. Nguyen, H. Je, T. N. Nguyen, S. Ryu, K. Lee, H.-J. Lee, "ShortcutFusion: From
Tensorflow to FPGA-based accelerator with reuse-aware memory allocation for shortcut data"
(seeds/003), Sec. V, Tables II, III, IV and VI and Fig. 16 (KCU1500, 8-bit, Ti = To = 64).
The paper writes "MB" without saying whether it means 10⁶ or 2²⁰ bytes; reports show both.

Later sections quote Kim et al. (seeds/000–001) and Cipolletta & Calimera (seeds/002).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PaperMinBuffer", "TABLE_II", "PaperVgg", "TABLE_III", "CITATION", "PaperPerformance",
           "TABLE_IV", "TABLE_VI", "PaperFig16", "FIG_16", "TABLE_IV_CITATION",
           "TABLE_VI_CITATION", "FIG_16_CITATION", "FIG_17_CITATION", "KIM_CITATION",
           "KimModule", "KIM_TABLE_1", "KIM_TOTAL", "KIM_SRAM_KB", "RESTRUCTURE_CITATION",
           "PaperRestructure", "RESTRUCTURE_TABLE_II", "RESTRUCTURE_TABLE_III",
           "RESTRUCTURE_AVERAGE_II", "RESTRUCTURE_AVERAGE_III", "RESTRUCTURE_SWEEP_SECONDS"]

CITATION = ("Nguyen et al., ShortcutFusion, Sec. V-B, "
            "Table II (minimum buffer size) and Table III (VGG-CONV)")


@dataclass(frozen=True)
class PaperMinBuffer:
    """One row of Table II: minimum on-chip buffer meeting the DRAM access constraint (10)."""
    network: str             # our builder name
    label: str               # the paper's name
    input_size: int
    layers: str              # "number of layers", including shortcut, concat, … layers
    min_buffer_mb: float
    conv_only: bool = False  # VGG-CONV: the 13 convolution layers (with their pooling)


TABLE_II: tuple[PaperMinBuffer, ...] = (
    PaperMinBuffer("yolov2", "YOLO v2", 416, "21", 0.762),
    PaperMinBuffer("vgg16", "VGG-CONV", 224, "13", 0.712, conv_only=True),
    PaperMinBuffer("yolov3", "YOLO v3", 416, "106", 1.682),
    PaperMinBuffer("retinanet", "RetinaNet", 512, "137", 2.392),
    PaperMinBuffer("resnet50", "ResNet50", 224, "68", 1.039),
    PaperMinBuffer("resnet152", "ResNet152", 224, "204", 1.039),
    PaperMinBuffer("efficientnet_b1", "EfficientNet-B1", 256, "181", 0.43),
)


@dataclass(frozen=True)
class PaperVgg:
    """One column of Table III: VGG-16 convolution layers at 224×224."""
    design: str
    precision: str
    sram_mb: float
    dram_mb: float


TABLE_III: tuple[PaperVgg, ...] = (
    PaperVgg("OLAccel", "mixed 4/8-bit", 2.4, 42.8),
    PaperVgg("SmartShuttle", "8-bit", 0.75, 58.1),
    PaperVgg("ShortcutFusion", "8-bit", 0.712, 42.8),
)


# --------------------------------------------------------------------------------------------
# Tables IV and VI, Fig. 16 (Sec. V-A and V-C)
# --------------------------------------------------------------------------------------------

TABLE_IV_CITATION = "Nguyen et al., ShortcutFusion, Sec. V-B, Table IV (KCU1500, 200 MHz, 8-bit)"
TABLE_VI_CITATION = "Nguyen et al., ShortcutFusion, Sec. V-C, Table VI (EfficientNet-B1, KCU1500)"
FIG_16_CITATION = "Nguyen et al., ShortcutFusion, Sec. V-A and Fig. 16 (YOLOv2 at 416×416)"
FIG_17_CITATION = "Nguyen et al., ShortcutFusion, Sec. V-A and Fig. 17 (YOLOv3, ResNet152, " \
    "EfficientNet-B1)"


@dataclass(frozen=True)
class PaperPerformance:
    """One column of Table IV or Table VI. ``None``: the table has no such entry."""
    network: str             # our builder name
    label: str
    input_size: int
    gop: float | None        # "CNN size (GOP)"
    bram18k: int | None
    latency_ms: float | None
    gops: float
    mac_efficiency_pct: float
    offchip_fm_mb: float     # feature-map DRAM traffic of the chosen policy
    total_once_mb: float     # "total off-chip memory access if data are accessed exactly once"
    reduction_pct: float     # "off-chip reduction"
    source: str
    # The design as built for this column (configured per CNN; 4 096 MACs on 2 048 DSP48E2
    # with packing): "LUTs/FFs (K)" and "DSP utilization" / "DSPs".
    luts_k: float
    ffs_k: float
    dsps: int

    @property
    def implied_offchip_mb(self) -> float:
        """The policy's total DRAM traffic the reduction implies: total_once · (1 − r)."""
        return self.total_once_mb * (1 - self.reduction_pct / 100)

    @property
    def implied_weights_mb(self) -> float:
        """What the reduction leaves for weights once the feature maps are paid; close to the
        model size when the reduction counts weights, ≤ 0 when the row is inconsistent."""
        return self.implied_offchip_mb - self.offchip_fm_mb


TABLE_IV: tuple[PaperPerformance, ...] = (
    PaperPerformance("resnet50", "ResNet50", 256, 11.76, 2368, 11.69, 1006, 61.4, 0.19, 59.09,
                     60.62, "Table IV",
                     luts_k=212.7, ffs_k=361.5, dsps=2240),
    PaperPerformance("resnet152", "ResNet152", 256, 31.16, 2368, 26.78, 1163, 71.0, 0.19, 130.2,
                     56.7, "Table IV",
                     luts_k=212.7, ffs_k=361.5, dsps=2240),
    PaperPerformance("yolov2", "YOLO v2", 416, 17.18, 2304, 14.73, 1166, 71.2, 0.66, 48.9,
                     70.31, "Table IV",
                     luts_k=203.1, ffs_k=331.0, dsps=2240),
    PaperPerformance("yolov3", "YOLO v3", 416, 65.86, 3020, 57.57, 1142, 69.7, 90.6, 153.5,
                     60.34, "Table IV",
                     luts_k=213.3, ffs_k=352.0, dsps=2240),
    PaperPerformance("retinanet", "RetinaNet", 512, 102.2, 3766, 93.16, 1097, 67.0, 136.4,
                     261.34, 47.81, "Table IV",
                     luts_k=264.3, ffs_k=367.2, dsps=2240),
    PaperPerformance("efficientnet_b1", "EfficientNet-B1", 256, 1.38, 2594, 4.69, 317.1, 19.37,
                     0.19, 60.7, 84.81, "Table IV",
                     luts_k=264.1, ffs_k=375.7, dsps=2240),
)

TABLE_VI: tuple[PaperPerformance, ...] = (
    PaperPerformance("efficientnet_b1", "EfficientNet-B1", 256, None, 2594, None, 317.1, 19.37,
                     0.19, 60.7, 84.81, "Table VI",
                     luts_k=264.1, ffs_k=375.7, dsps=2176),
    PaperPerformance("efficientnet_b1", "EfficientNet-B1", 512, None, 2723, None, 267.4, 16.3,
                     144, 216, 29.2, "Table VI",
                     luts_k=264.5, ffs_k=375.5, dsps=2176),
    PaperPerformance("efficientnet_b1", "EfficientNet-B1", 768, None, 3845, None, 274.4, 16.75,
                     344, 475, 27.6, "Table VI",
                     luts_k=271.7, ffs_k=375.4, dsps=2176),
)


@dataclass(frozen=True)
class PaperFig16:
    """YOLOv2 at 416: fixed row-based reuse (baseline) vs the coarse-grained switching."""
    min_sram_mb: float = 0.76        # "minimum SRAM required is 0.76 MB"
    cut_layer: str = "layer 12 (CONV9)"
    speedup: float = 2.17            # baseline latency / proposed latency (Fig. 16c)
    buffer_ratio: float = 5.73       # baseline buffer / proposed buffer


FIG_16 = PaperFig16()


# --------------------------------------------------------------------------------------------
# Kim et al., module-level on-chip allocation (seeds/000–001), Table 1
# --------------------------------------------------------------------------------------------

KIM_CITATION = ("D. Kim, K.-Y. Kim, S. Ko, S. Ha, \"A Simple Method to Reduce Off-chip Memory "
                "Accesses on Convolutional Neural Networks\", Sec. 4 and Table 1 "
                "(Inception-V3 at 299×299, Samsung NPU with 1024 KB on chip, 8-bit)")
#: On-chip memory of the paper's NPU (KB; its per-layer figures are multiples of 1024 bytes).
KIM_SRAM_KB = 1024


@dataclass(frozen=True)
class KimModule:
    """One row of Table 1: off-chip traffic of one Inception-V3 module, KB."""
    label: str               # the paper's name
    module: str              # the module in our builder (torchvision naming)
    weights_kb: float
    naive_fm_kb: float
    naive_total_kb: float
    proposed_fm_kb: float
    proposed_total_kb: float
    naive_reads: int         # feature-map transfers (one per layer operand)
    naive_writes: int
    proposed_reads: int
    proposed_writes: int


KIM_TABLE_1: tuple[KimModule, ...] = (
    KimModule("inception-a1", "Mixed_5b", 249, 2308.5, 2557.5, 0, 249, 8, 8, 0, 0),
    KimModule("inception-a2", "Mixed_5c", 270, 2835, 3105, 0, 270, 8, 8, 0, 0),
    KimModule("inception-a3", "Mixed_5d", 277.5, 3078, 3355.5, 0, 277.5, 8, 8, 0, 0),
    KimModule("reduction-a", "Mixed_6a", 1125, 1798.5, 2923.5, 300, 1425, 5, 5, 0, 3),
    KimModule("inception-b1", "Mixed_6b", 1264, 2700, 3964, 300, 1564, 11, 11, 1, 0),
    KimModule("inception-b2", "Mixed_6c", 1648, 2850, 4498, 0, 1648, 11, 11, 0, 0),
    KimModule("inception-b3", "Mixed_6d", 1648, 2850, 4498, 0, 1648, 11, 11, 0, 0),
    KimModule("inception-b4", "Mixed_6e", 2088, 3000, 5088, 0, 2088, 11, 11, 0, 0),
    KimModule("reduction-b", "Mixed_7a", 1656, 1580, 3236, 0, 1656, 7, 7, 0, 0),
    KimModule("inception-c1", "Mixed_7b", 4920, 808, 5728, 0, 4920, 10, 10, 0, 0),
    KimModule("inception-c2", "Mixed_7c", 5928, 1096, 7024, 0, 5928, 10, 10, 0, 0),
)
#: The table's total row (feature-map reduction 97.59 %, overall 47.14 %).
KIM_TOTAL = KimModule("total", "", 21073.5, 24904, 45977.5, 600, 21673.5, 100, 100, 1, 3)


# --------------------------------------------------------------------------------------------
# Cipolletta & Calimera, dataflow restructuring (seeds/002), Tables II and III
# --------------------------------------------------------------------------------------------

RESTRUCTURE_CITATION = ("A. Cipolletta, A. Calimera, \"Dataflow Restructuring for Active Memory "
                        "Reduction in Deep Neural Networks\", DATE 2021 (seeds/002), Sec. V, "
                        "Tables II and III")


@dataclass(frozen=True)
class PaperRestructure:
    """One row of Table II (``n_slices`` = 2h × 2w) or Table III (best ``n_slices``) at α_opt:
    peak activation memory saving and extra operations, both relative to the original model."""
    network: str             # our builder name
    label: str
    alpha: float
    n_slices: tuple[int, int]      # (h, w)
    saving_pct: float
    overhead_pct: float


RESTRUCTURE_TABLE_II: tuple[PaperRestructure, ...] = (
    PaperRestructure("vgg16", "VGG-16", 0.4, (2, 2), 67.5, 1.1),
    PaperRestructure("mobilenet_v2", "MobileNetV2", 0.3, (2, 2), 60.5, 3.0),
    PaperRestructure("squeezenet1_1", "SqueezeNetV1.1", 0.2, (2, 2), 48.4, 3.1),
    PaperRestructure("resnet18", "ResNet18", 0.4, (2, 2), 41.6, 11.9),
    PaperRestructure("inception_v3", "InceptionV3", 0.6, (2, 2), 53.5, 1.4),
)
RESTRUCTURE_TABLE_III: tuple[PaperRestructure, ...] = (
    PaperRestructure("vgg16", "VGG-16", 0.4, (2, 4), 75.0, 2.3),
    PaperRestructure("mobilenet_v2", "MobileNetV2", 0.3, (3, 4), 77.3, 7.8),
    PaperRestructure("squeezenet1_1", "SqueezeNetV1.1", 0.2, (2, 2), 48.4, 3.1),
    PaperRestructure("resnet18", "ResNet18", 0.4, (3, 3), 48.8, 25.7),
    PaperRestructure("inception_v3", "InceptionV3", 0.6, (3, 3), 64.9, 3.9),
)
#: Averages printed under the tables (saving %, overhead %).
RESTRUCTURE_AVERAGE_II = (54.3, 4.1)
RESTRUCTURE_AVERAGE_III = (62.9, 8.6)
#: Sec. V: the sweep over nine α values took 82 s (SqueezeNetV1.1, fastest) to 375 s
#: (InceptionV3, slowest), single core, Intel i7-8700K.
RESTRUCTURE_SWEEP_SECONDS = {"squeezenet1_1": 82.0, "inception_v3": 375.0}
