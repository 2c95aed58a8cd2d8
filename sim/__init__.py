"""The executors beside the RTL: the golden model (bit-exact semantics) and the cycle-accurate
model (per-group cycles and DRAM bytes)."""
