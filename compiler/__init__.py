"""The compiler: ONNX (float or int8 QDQ) to fused groups, on-chip allocation, 11-word
instructions and a DRAM image."""
