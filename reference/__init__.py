"""Float64 NumPy references of the SSD forward (never imports kernels/).

Whole forward: `ssd_recurrent` (the ground truth), `ssd_chunked` (the per-kernel references
composed), `ssd_quadratic` (the attention form). Per kernel: `chunk_cumsum_ref`,
`fwd_pass_state_ref`, `compute_out_ref`, `ssd_scan_ref` (the two before it composed). Packed
variable-length rows (cu_seqlens): `ssd_varlen_ref`, each sequence a call of any of the three
forms. Magnitude bounds M (the same computation on absolute values, |y| <= M): `ssd_magnitude`,
`fwd_pass_state_magnitude`, `compute_out_magnitude`.
"""

from reference.chunk_cumsum import chunk_cumsum_ref
from reference.compute_out import compute_out_magnitude, compute_out_ref
from reference.fwd_pass_state import fwd_pass_state_magnitude, fwd_pass_state_ref
from reference.ssd import ssd_chunked, ssd_magnitude, ssd_quadratic, ssd_recurrent
from reference.ssd_scan import ssd_scan_ref
from reference.varlen import ssd_varlen_ref

__all__ = [
    "ssd_recurrent", "ssd_chunked", "ssd_quadratic", "ssd_magnitude",
    "chunk_cumsum_ref", "fwd_pass_state_ref", "fwd_pass_state_magnitude",
    "compute_out_ref", "compute_out_magnitude", "ssd_scan_ref", "ssd_varlen_ref",
]
