"""A plain PyTorch chunked SSD forward: the side-by-side baseline "what torch ops alone give".

The spec's chunked form in einsum/cumsum, without custom kernels, in the inputs' dtype. It
materializes the (chunk_size x chunk_size) decay and C.B^T matrices of every chunk in global
memory, which the cuTile kernels avoid. Scope: the options the anchors use (D of either shape,
initial_states, return_final_states); dt is taken as already processed (no dt_bias, softplus,
dt_limit, z or seq_idx).
"""

from __future__ import annotations

import math

import torch


def ssd_chunked_torch(x, dt, A, B, C, chunk_size, D=None, initial_states=None,
                      return_final_states=False):
    """y, or (y, final_states) with return_final_states; shapes as in ssd_forward.

    1. pad seqlen to a multiple of chunk_size (padded tokens have dt = 0: no effect on states)
       and split into chunks; heads are (ngroups, heads per group) so B and C are never repeated
    2. a = cumsum of dt * A inside each chunk (natural log units, non-increasing)
    3. intra-chunk: y_t += sum_{s <= t} (C_t . B_s) exp(a_t - a_s) dt_s x_s  (masked by a select)
    4. chunk states: new_c = sum_s x_s (dt_s exp(a_last - a_s)) B_s^T
    5. states entering each chunk: S_{c+1} = exp(a_last,c) S_c + new_c, as one product with the
       lower-triangular chunk-to-chunk decay matrix, from S_0 = initial_states (or 0)
    6. carried term: y_t += exp(a_t) (C_t . S_c^T);  skip: y += D x
    """
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    hpg = nheads // ngroups
    nchunks = math.ceil(seqlen / chunk_size)
    pad = nchunks * chunk_size - seqlen
    # 1.
    if pad:
        x, dt, B, C = (torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
                       for t in (x, dt, B, C))
    xc = x.reshape(batch, nchunks, chunk_size, ngroups, hpg, headdim)
    dtc = dt.reshape(batch, nchunks, chunk_size, ngroups, hpg)
    Bc = B.reshape(batch, nchunks, chunk_size, ngroups, dstate)
    Cc = C.reshape(batch, nchunks, chunk_size, ngroups, dstate)
    # 2. [batch, ngroups, hpg, nchunks, chunk_size]
    a = torch.cumsum(dtc.permute(0, 3, 4, 1, 2) * A.reshape(ngroups, hpg, 1, 1), dim=-1)
    a_last = a[..., -1]  # [batch, ngroups, hpg, nchunks]
    # 3. decay[t, s] = exp(a_t - a_s) for s <= t, else 0; [batch, ngroups, hpg, nchunks, t, s]
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    diff = a[..., :, None] - a[..., None, :]
    decay = torch.exp(torch.where(causal, diff, torch.full_like(diff, -math.inf)))
    CB = torch.einsum("bctgn,bcsgn->bgcts", Cc, Bc)
    dtx = xc * dtc[..., None]
    y = torch.einsum("bgcts,bghcts,bcsghp->bctghp", CB, decay, dtx)
    # 4. [batch, nchunks, ngroups, hpg, headdim, dstate]
    w = torch.exp(a_last[..., None] - a)  # [batch, ngroups, hpg, nchunks, chunk_size]
    new = torch.einsum("bcsghp,bghcs,bcsgn->bcghpn", xc, w * dtc.permute(0, 3, 4, 1, 2), Bc)
    # 5. chunk_decay[i, j] = exp(a_last_j + ... + a_last_{i-1}) for j < i (state after chunk j
    #    carried to the entry of chunk i), 1 on the diagonal for the initial state at i = j = 0
    S0 = (torch.zeros(batch, 1, ngroups, hpg, headdim, dstate, dtype=x.dtype, device=x.device)
          if initial_states is None
          else initial_states.reshape(batch, 1, ngroups, hpg, headdim, dstate).to(x.dtype))
    states = torch.cat([S0, new], dim=1)  # [batch, nchunks + 1, ...]: S0, then new_0 .. new_{C-1}
    cum = torch.nn.functional.pad(torch.cumsum(a_last, dim=-1), (1, 0))  # [b, g, hpg, nchunks + 1]
    seg = cum[..., :, None] - cum[..., None, :]
    lower = torch.ones(nchunks + 1, nchunks + 1, dtype=torch.bool, device=x.device).tril()
    chunk_decay = torch.exp(torch.where(lower, seg, torch.full_like(seg, -math.inf)))
    # entering[i] = S0 * decay(0 -> i) + sum_{j < i} new_j * decay(j + 1 -> i)
    entering = torch.einsum("bghij,bjghpn->bighpn", chunk_decay, states)
    # 6.
    S_in = entering[:, :nchunks]
    y = y + torch.einsum("bctgn,bcghpn,bghct->bctghp", Cc, S_in, torch.exp(a))
    y = y.reshape(batch, nchunks * chunk_size, nheads, headdim)[:, :seqlen]
    if D is not None:
        y = y + x[:, :seqlen] * (D if D.dim() == 2 else D[:, None])
    if not return_final_states:
        return y
    return y, entering[:, nchunks].reshape(batch, nheads, headdim, dstate)
