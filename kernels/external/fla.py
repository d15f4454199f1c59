"""flash-linear-attention's chunked gated delta rule (`fla-core`, installed with
`pip install ckptd[gpu]`), behind ckptd's varlen signature: a prefill step's sequences
in one call. fla keeps no state pool, so the step's cells are gathered into its
initial state [n, H, K, V] and its final state is written back (fp32, in place).

Same arguments as gated_delta.chunk.chunk_gated_delta_rule_varlen; tested against
the reference in tests/kernels/test_external.py where fla is installed (on CUDA).

fla multiplies in its inputs' dtype: q, k, v and beta must share one (a bf16 k beside an
fp32 beta does not compile: `recompute_w_u_fwd`), g is fp32. The model hands over q and
k in fp32 (l2norm's) beside bf16 values: all go in v's dtype, as ckptd's own kernel
multiplies them. fp32 steps keep ckptd's kernel (`usable`): fla would run them in TF32.
"""

from __future__ import annotations

import torch

from ckptd.kernels.varlen import device_cu, host_cu


def usable(v: torch.Tensor) -> bool:
    """fla serves half-precision steps (on tensor cores)."""
    return v.dtype in (torch.bfloat16, torch.float16)


def chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                                  scale=None, chunk_size=64):
    """q, k [N, H, K] (L2-normalized); v [N, H, V]; g, beta [N, H]; cu_seqlens int
    [n + 1] or a Varlen; state_pool [S, H, K, V] fp32 updated at state_indices [n].
    Returns o [N, H, V] in v's dtype. chunk_size is fla's own (64)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # optional (extra gpu)

    cu = host_cu(cu_seqlens)
    idx = torch.as_tensor(state_indices, device=q.device).to(torch.int64)
    dt = v.dtype
    # the host copy of cu_seqlens spares fla reading it back from the device
    o, final = chunk_gated_delta_rule(
        q[None].to(dt), k[None].to(dt), v[None], g[None].float(), beta[None].to(dt), scale=scale,
        initial_state=state_pool[idx], output_final_state=True,
        cu_seqlens=device_cu(cu_seqlens, q.device).to(torch.int64),
        cu_seqlens_cpu=torch.tensor(cu, dtype=torch.int64, device="cpu"))
    state_pool[idx] = final.to(state_pool.dtype)
    return o[0].to(v.dtype)
