"""The accelerator in Amaranth HDL: datapath blocks, the group controller, DMA, CSRs, and the
board tops."""
