"""Numeric constants the kernels share."""

LOG2E = 1.4426950408889634  # log2(e): dA_cumsum is in log2 units, later exponentials are exp2
