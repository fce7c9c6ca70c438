"""Numeric constants the kernels share."""

LOG2E = 1.4426950408889634  # log2(e): dA_cumsum is in log2 units, later exponentials are exp2

# The bits of a call's error word (kernels/errors.py): the kernels that read A, dt_bias and D
# set them where a value is bad (A not finite and < 0, dt_bias or D not finite), and write NaN
# to every output the value feeds.
ERROR_A = 1
ERROR_DT_BIAS = 2
ERROR_D = 4
# ssd_varlen: offsets that do not start at 0, decrease, or end short of or past seqlen
ERROR_CU_SEQLENS = 8
# the bits the host raises as errors
ERRORS = ERROR_A | ERROR_DT_BIAS | ERROR_D | ERROR_CU_SEQLENS
# no error: ssd_scan's float16 launch found a product leaving float16's range (a computed
# operand past 65504 rounds to inf); its second launch, which reads the bit, recomputes the
# call's outputs with TF32 operands
FLOAT16_RANGE = 16
