"""Applications on top of the contracts, compiler, models and hardware: benchmarks, FPGA builds
and the host tool for a board."""
