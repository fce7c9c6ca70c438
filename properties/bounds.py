"""Error bounds of the kernels against the float64 reference: every tolerance lives here.

The a-priori bound (spec, "Numerical facts"): with M the same forward computed in float64 on
|x|, |B|, |C|, |D|, |initial_states| (decays and dt unchanged), a correct TF32 kernel satisfies,
per element, |y - y_ref| <= KAPPA * U_TF32 * M.
"""

U_TF32 = 2.0 ** -11  # unit roundoff of a TF32 operand: 10-bit mantissa, round to nearest
U_FP32 = 2.0 ** -24  # unit roundoff of fp32 arithmetic and accumulation

# Provisional (issue 3 says: take 8 until the property suite derives it from the roundings on each path).
KAPPA = 8.0


def tf32_bound(M):
    """Per-element bound on |y - y_ref| for a TF32 kernel, given the magnitude M."""
    return KAPPA * U_TF32 * M
