"""The papers' studies: sfnpu's memory optimizer, module allocation, dataflow restructuring and
BN restructuring beside the figures the papers report."""
