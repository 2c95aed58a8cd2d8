"""Published figures the memory optimizer is compared with — quoted as reference data, in one
place.

Source: D. T. Nguyen, H. Je, T. N. Nguyen, S. Ryu, K. Lee, H.-J. Lee, "ShortcutFusion: From
Tensorflow to FPGA-based accelerator with reuse-aware memory allocation for shortcut data"
(seeds/003), Sec. V-B, Tables II and III (KCU1500, 8-bit, Ti = To = 64).
The paper writes "MB" without saying whether it means 10⁶ or 2²⁰ bytes; reports show both.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PaperMinBuffer", "TABLE_II", "PaperVgg", "TABLE_III", "CITATION"]

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
