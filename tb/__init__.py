"""Testbenches: the accelerator and its blocks on Verilator (C++ hosts and cocotb), with the
golden and cycle models as scoreboard."""
