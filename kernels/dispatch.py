"""Every kernel op, routed per call to its Triton kernel or its plain-torch reference.

`CKPTD_KERNELS` picks: `auto` (default) runs Triton when the op's main tensor is on
CUDA and triton is installed, the reference otherwise (for attention: torch's fused
SDPA, which is tested against the reference); `triton` always runs Triton (on CPU
tensors that needs `TRITON_INTERPRET=1` set before triton is first imported);
`torch` always runs the plain reference. Triton modules are imported on first
use, so a CPU-only process never imports triton.
"""

from __future__ import annotations

import importlib
import os
from importlib.util import find_spec

import torch

from ckptd.kernels import external
from ckptd.kernels.conv1d import naive as conv_ref
from ckptd.kernels.conv1d import reference_varlen as conv_varlen_ref
from ckptd.kernels.gated_delta import naive as gdn_ref
from ckptd.kernels.gated_delta import reference_varlen as gdn_varlen_ref
from ckptd.kernels.mamba1 import reference_varlen as scan_ref
from ckptd.kernels.mamba2 import reference_varlen as ssd_ref
from ckptd.kernels.moe import naive as moe_ref
from ckptd.kernels.norm import naive as norm_ref
from ckptd.kernels.paged_attention import naive as attn_ref
from ckptd.kernels.paged_attention import reference_varlen as attn_varlen_ref
from ckptd.kernels.paged_attention import sdpa as attn_sdpa
from ckptd.kernels.quant import naive as quant_ref
from ckptd.kernels.rotary import naive as rotary_ref
from ckptd.kernels.swiglu import naive as swiglu_ref

_HAVE_TRITON = find_spec("triton") is not None
_MODES = ("auto", "triton", "torch")
# the optional kernels of `pip install ckptd[gpu]`; CKPTD_EXTERNAL_KERNELS=off keeps ours
_HAVE_FLA = find_spec("fla") is not None
_HAVE_FLASH = find_spec("flash_attn") is not None

# The process's kernels, read once from CKPTD_KERNELS and CKPTD_EXTERNAL_KERNELS (every
# op asks; a test sets these, monkeypatch.setattr(dispatch, "MODE", ...), not the variables)
MODE = os.environ.get("CKPTD_KERNELS", "auto")
EXTERNAL = os.environ.get("CKPTD_EXTERNAL_KERNELS", "auto") != "off"


def use_external(name: str, x: torch.Tensor) -> bool:
    """Whether a prefill step runs fla ("fla") or flash-attn ("flash") on x: installed,
    importable, on CUDA, and not turned off. Decode steps keep ckptd's kernels (CUDA
    graphs)."""
    if not EXTERNAL or not x.is_cuda or not (_HAVE_FLA if name == "fla" else _HAVE_FLASH):
        return False
    return external.imports(name)


def use_triton(x: torch.Tensor) -> bool:
    """Whether an op whose main tensor is x runs its Triton kernel."""
    mode = MODE
    if mode == "auto":
        return x.is_cuda and _HAVE_TRITON
    if mode == "torch":
        return False
    if mode != "triton":
        raise ValueError(f"CKPTD_KERNELS must be one of {_MODES}, got {mode!r}")
    if not _HAVE_TRITON:
        raise ValueError("CKPTD_KERNELS=triton but triton is not installed")
    # only Triton on CPU tensors (the interpreter: tests) looks at the environment here
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("CKPTD_KERNELS=triton on CPU tensors needs TRITON_INTERPRET=1, "
                         "set before triton is imported")
    return True


_MODULES: dict[str, object] = {}


def _fast(module: str):
    # the installed name: a bare `kernels.` resolves only when the repo root is on sys.path;
    # kept here, since a decode step asks ~100 times (import_module's checks add up)
    mod = _MODULES.get(module)
    if mod is None:
        mod = _MODULES[module] = importlib.import_module(f"ckptd.kernels.{module}")
    return mod


# gated delta rule


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, scale=None, chunk_size=64):
    """q, k [T, H, K]; v [T, H, V]; g, beta [T, H]; initial_state [H, K, V] or None.
    Returns o [T, H, V] and the final state [H, K, V] fp32."""
    impl = _fast("gated_delta.chunk") if use_triton(q) else gdn_ref
    return impl.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, scale, chunk_size)


def recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=None, scale=None):
    """As chunk_gated_delta_rule, token by token (decode, short chunks)."""
    impl = _fast("gated_delta.fused_recurrent") if use_triton(q) else gdn_ref
    return impl.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state, scale)


def chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                                  scale=None, chunk_size=64):
    """Packed sequences: q, k [N, H, K]; v [N, H, V]; g, beta [N, H]; cu_seqlens int
    [n + 1]; state_pool [S, H, K, V] fp32 updated in place at state_indices [n].
    Returns o [N, H, V]."""
    impl = _fast("gated_delta.chunk") if use_triton(q) else gdn_varlen_ref
    return impl.chunk_gated_delta_rule_varlen(q, k, v, g, beta, cu_seqlens, state_pool,
                                              state_indices, scale, chunk_size)


def recurrent_gated_delta_rule_varlen(q, k, v, g, beta, cu_seqlens, state_pool, state_indices,
                                      scale=None):
    """As chunk_gated_delta_rule_varlen, token by token."""
    impl = _fast("gated_delta.fused_recurrent") if use_triton(q) else gdn_varlen_ref
    return impl.recurrent_gated_delta_rule_varlen(q, k, v, g, beta, cu_seqlens, state_pool,
                                                  state_indices, scale)


def gated_delta_decode(q, k, v, g, beta, state_pool, state_indices, scale=None):
    """One token for each of N sequences: q, k [N, H, K]; v [N, H, V]; g, beta [N, H];
    state_pool[state_indices[n]] advanced in place. Returns o [N, H, V]."""
    impl = _fast("gated_delta.fused_recurrent") if use_triton(q) else gdn_varlen_ref
    return impl.gated_delta_decode(q, k, v, g, beta, state_pool, state_indices, scale)


def l2norm(x, eps=1e-6):
    """x / sqrt(sum(x^2) + eps) over the last dim, float32."""
    if use_triton(x):
        return _fast("norm.triton_norm").l2norm(x, eps)
    return gdn_ref.l2norm(x, eps)


# causal conv1d


def causal_conv1d(x, weight, bias=None, initial_state=None, activation="silu"):
    """x [T, C]; weight [C, K]; initial_state [C, K-1] or None. Returns y [T, C] and
    the final state [C, K-1]."""
    impl = _fast("conv1d.triton_conv") if use_triton(x) else conv_ref
    return impl.causal_conv1d(x, weight, bias, initial_state, activation)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation="silu"):
    """x [N, C]; conv_state [N, C, K-1] (not modified). Returns y [N, C], new state."""
    impl = _fast("conv1d.triton_conv") if use_triton(x) else conv_ref
    return impl.causal_conv1d_update(x, conv_state, weight, bias, activation)


def causal_conv1d_varlen(x, weight, bias, cu_seqlens, conv_pool, state_indices,
                         activation="silu"):
    """Packed sequences: x [N, C]; conv_pool [S, C, K-1] updated in place at
    state_indices [n]. Returns y [N, C]."""
    impl = _fast("conv1d.triton_conv") if use_triton(x) else conv_varlen_ref
    return impl.causal_conv1d_varlen(x, weight, bias, cu_seqlens, conv_pool, state_indices,
                                     activation)


def causal_conv1d_update_cells(x, conv_pool, state_indices, weight, bias=None,
                               activation="silu"):
    """One token per sequence: x [N, C]; conv_pool [S, C, K-1] advanced in place at
    state_indices [N]. Returns y [N, C]."""
    impl = _fast("conv1d.triton_conv") if use_triton(x) else conv_varlen_ref
    return impl.causal_conv1d_update_cells(x, conv_pool, state_indices, weight, bias,
                                           activation)


# attention over paged KV, and moving pages / state cells


def write_kv(kv_pool, layer, kv_index, k, v):
    """k, v [N, Hkv, D] into flat positions kv_index [N] of `layer`, in place."""
    impl = _fast("paged_attention.triton_pages") if use_triton(kv_pool) else attn_ref
    impl.write_kv(kv_pool, layer, kv_index, k, v)


def _attention_impl(q):
    """Triton; else torch's SDPA (fused, the default off CUDA); the plain reference
    when CKPTD_KERNELS=torch."""
    if use_triton(q):
        return _fast("paged_attention.triton_attention")
    return attn_ref if MODE == "torch" else attn_sdpa


def paged_attention(q, kv_pool, layer, page_table, ctx_len, scale, window=0, sinks=None):
    """q [T, Hq, D]: the last T of ctx_len + T tokens in page_table's pages; window: keys
    a query sees (0: all); sinks [Hq]: a logit per head in the softmax's denominator
    (gpt-oss) or None. [T, Hq, D]."""
    return _attention_impl(q).paged_attention(q, kv_pool, layer, page_table, ctx_len, scale,
                                              window=window, sinks=sinks)


def paged_decode_attention(q, kv_pool, layer, page_tables, seq_lens, scale):
    """q [N, Hq, D]: the last token of each sequence; page_tables int32 [N, max_pages];
    seq_lens int32 [N]. Returns [N, Hq, D]."""
    return _attention_impl(q).paged_decode_attention(q, kv_pool, layer, page_tables, seq_lens,
                                                     scale)


def paged_attention_varlen(q, kv_pool, layer, cu_seqlens, ctx_lens, page_tables, scale,
                           max_q_len=None, window=0, sinks=None):
    """Chunks of several sequences: q [N, Hq, D] packed by cu_seqlens [n + 1]; ctx_lens
    [n]; page_tables int32 [n, max_pages]; window: keys a query sees (0: all); sinks [Hq]
    or None. Returns [N, Hq, D]."""
    impl = _fast("paged_attention.triton_attention") if use_triton(q) else attn_varlen_ref
    return impl.paged_attention_varlen(q, kv_pool, layer, cu_seqlens, ctx_lens, page_tables,
                                       scale, max_q_len, window=window, sinks=sinks)


def gather_pages(kv_pool, page_ids):
    """Contiguous copy of whole pages: [n, n_attn, 2, B, Hkv, D]."""
    if use_triton(kv_pool) and kv_pool[0].is_contiguous():
        return _fast("paged_attention.triton_pages").gather_rows(kv_pool, page_ids)
    return attn_ref.gather_pages(kv_pool, page_ids)


def scatter_pages(kv_pool, page_ids, pages):
    """Whole pages [n, n_attn, 2, B, Hkv, D] into the pool at page_ids, in place."""
    if use_triton(kv_pool) and kv_pool[0].is_contiguous():
        _fast("paged_attention.triton_pages").scatter_rows(kv_pool, page_ids, pages)
    else:
        attn_ref.scatter_pages(kv_pool, page_ids, pages)


def gather_states(pool, cell_ids):
    """Contiguous copy of state cells of a conv or ssm pool [S, ...]: [n, ...]."""
    return gather_pages(pool, cell_ids)


def scatter_states(pool, cell_ids, states):
    """State cells [n, ...] into a conv or ssm pool [S, ...] at cell_ids, in place."""
    scatter_pages(pool, cell_ids, states)


# norms, rotary, activation


def rms_norm(x, weight, eps, offset=0.0):
    """x [..., D]; weight [D]. x / rms(x) * (weight + offset)."""
    impl = _fast("norm.triton_norm") if use_triton(x) else norm_ref
    return impl.rms_norm(x, weight, eps, offset)


def gated_rms_norm(x, z, weight, eps):
    """(weight * norm(x)) * silu(z); x, z [..., D]; weight [D]."""
    impl = _fast("norm.triton_norm") if use_triton(x) else norm_ref
    return impl.gated_rms_norm(x, z, weight, eps)


def apply_rotary(x, cos, sin):
    """x [T, H, D]; cos, sin [T, R]: rotate the first R dims of each head."""
    if cos.shape[-1] == 0:        # a model without position embedding (NoPE)
        return x
    impl = _fast("rotary.triton_rotary") if use_triton(x) else rotary_ref
    return impl.apply_rotary(x, cos, sin)


def silu_and_mul(gate, up):
    """silu(gate) * up."""
    impl = _fast("swiglu.triton_swiglu") if use_triton(gate) else swiglu_ref
    return impl.silu_and_mul(gate, up)


rotary_cos_sin = rotary_ref.rotary_cos_sin
mrope_cos_sin = rotary_ref.mrope_cos_sin


# mixture of experts


def moe_experts(x, topk_ids, topk_w, w_gate_up, w_down):
    """x [N, H]; topk_ids, topk_w [N, k]; w_gate_up [E, 2I, H]; w_down [E, H, I]. Returns
    [N, H]: each token's routed experts' SwiGLU outputs, weighted and summed; grouped by
    expert (kernels/moe/)."""
    impl = _fast("moe.triton_moe") if use_triton(x) else moe_ref
    return impl.moe_experts(x, topk_ids, topk_w, w_gate_up, w_down)


def moe_experts_clamped(x, topk_ids, topk_w, w_gate_up, b_gate_up, w_down, b_down, alpha,
                        limit):
    """gpt-oss' experts: moe_experts with biases b_gate_up [E, 2I], b_down [E, H] and the
    clamped SwiGLU (alpha, limit); the same grouped GEMM in Triton."""
    impl = _fast("moe.triton_moe") if use_triton(x) else moe_ref
    return impl.moe_experts_clamped(x, topk_ids, topk_w, w_gate_up, b_gate_up, w_down,
                                    b_down, alpha, limit)


# weights kept in their GGUF formats (kernels/quant/)


def quant_matmul(x, qt, bias=None, shared=None, activations="fp32"):
    """x [M, K] @ W.T (+ bias) -> [M, N], W [N, K] a kept QuantTensor: Triton dequantizes
    tiles inside the matmul; on the CPU the compiled kernels (kernels/quant/cpu.py)
    multiply a decode step's rows block by block (activations "q8": in integers, the
    input rounded to int8; kernels/quant/cpu.py), else the plain reference. `shared`: a
    dict the matmuls of one input pass along (the int8 activations, made once)."""
    if use_triton(x):
        gemv = _fast("quant.gemv")          # a decode step's rows: the GEMV over blocks
        if gemv.takes(x, qt):
            return gemv.matmul(x, qt, bias)
        return _fast("quant.triton_quant").matmul(x, qt, bias)
    if MODE != "torch" and x.dtype == torch.float32:
        cpu = _fast("quant.cpu")
        if cpu.supports(qt):
            return cpu.matmul(x, qt, bias, shared, activations)
    return quant_ref.matmul(x, qt, bias)


def quant_embedding(ids, qt, dtype=torch.float32):
    """Rows `ids` of a kept [V, H] table, dequantized (only those rows) to dtype."""
    return quant_ref.embedding(ids, qt, dtype)


def quant_moe_experts(x, topk_ids, topk_w, gate, up, down):
    """moe_experts with kept experts: gate, up [E, I, H], down [E, H, I] QuantTensors."""
    if use_triton(x):
        gemv = _fast("quant.gemv")          # a decode step's few tokens: a GEMV per pair
        if gemv.takes_experts(x, gate, up, down):
            return gemv.moe_experts(x, topk_ids, topk_w, gate, up, down)
        return _fast("quant.triton_quant").moe_experts(x, topk_ids, topk_w, gate, up, down)
    return quant_ref.moe_experts(x, topk_ids, topk_w, gate, up, down, mm=quant_matmul)


# one call per layer for a whole step of packed sequences (kernels/varlen.py)


def step_conv1d(x, weight, conv_pool, varlen, bias=None):
    """x [N, C]: the step's tokens; conv_pool [S, C, K-1] read and written in place at
    varlen.state_indices; bias [C] or None. Returns y [N, C] (silu)."""
    if varlen.decode_only:
        return causal_conv1d_update_cells(x, conv_pool, varlen.state_indices, weight, bias)
    return causal_conv1d_varlen(x, weight, bias, varlen, conv_pool, varlen.state_indices)


def step_gated_delta(q, k, v, g, beta, state_pool, varlen, recurrent=False):
    """q, k [N, H, K]; v [N, H, V]; g, beta [N, H]; state_pool [S, H, K, V] fp32 advanced
    in place at varlen.state_indices. Chunked unless every sequence has one token (or
    recurrent: token by token, for tests). Returns o [N, H, V]."""
    if varlen.decode_only or recurrent:
        return recurrent_gated_delta_rule_varlen(q, k, v, g, beta, varlen, state_pool,
                                                 varlen.state_indices)
    if use_external("fla", q):
        fla = _fast("external.fla")
        if fla.usable(v):
            return fla.chunk_gated_delta_rule_varlen(q, k, v, g, beta, varlen, state_pool,
                                                     varlen.state_indices)
    return chunk_gated_delta_rule_varlen(q, k, v, g, beta, varlen, state_pool,
                                         varlen.state_indices)


def step_attention(q, kv_pool, layer, varlen, scale, window=0, sinks=None):
    """q [N, Hq, D]: each sequence's new tokens, after its ctx tokens (their K/V already
    written); window: keys a query sees (0: all); sinks [Hq] or None (gpt-oss). Returns
    [N, Hq, D]. Triton: one launch for the step. Elsewhere SDPA (or the reference) per
    sequence on its host page table, which the CPU reads in place."""
    if not varlen.decode_only and not window and sinks is None \
            and use_external("flash", q):
        flash = _fast("external.flash")
        if flash.usable(kv_pool):
            return flash.step_attention(q, kv_pool, layer, varlen, scale)
    if use_triton(q):
        return _fast("paged_attention.triton_attention").paged_attention_varlen(
            q, kv_pool, layer, varlen.cu_seqlens, varlen.ctx_lens, varlen.page_tables, scale,
            max_q_len=varlen.max_q_len, window=window, sinks=sinks)
    impl = _attention_impl(q)           # not Triton (asked above): SDPA or the reference
    out = torch.empty_like(q)
    cu = varlen.cu
    for i in range(varlen.n):
        out[cu[i]:cu[i + 1]] = impl.paged_attention(q[cu[i]:cu[i + 1]], kv_pool, layer,
                                                    varlen.tables[i], varlen.ctx[i], scale,
                                                    window=window, sinks=sinks)
    return out


# selective state space scans: Mamba2's (SSD, kernels/mamba2) and Mamba's (kernels/mamba1)


def ssd_varlen(x, dt, A, B, C, D, cu_seqlens, state_pool, state_indices, chunked=True):
    """Packed sequences: x [N, H, P]; dt [N, H] (after softplus); A [H] (< 0); B, C
    [N, G, N_s]; D [H] or None; state_pool [S, H, P, N_s] fp32 advanced in place at
    state_indices [n]. Chunked (prefill) or token by token. Returns y [N, H, P]."""
    if not use_triton(x):
        return ssd_ref.ssd_varlen(x, dt, A, B, C, D, cu_seqlens, state_pool, state_indices,
                                  chunked)
    impl = _fast("mamba2.chunk") if chunked else _fast("mamba2.fused_recurrent")
    fn = impl.ssd_chunk_varlen if chunked else impl.ssd_recurrent_varlen
    return fn(x, dt, A, B, C, D, cu_seqlens, state_pool, state_indices)


def step_mamba2(x, dt, A, B, C, D, state_pool, varlen, recurrent=False):
    """One call per Mamba2 layer for a whole step (kernels/varlen.py): chunked unless
    every sequence has one token (or recurrent: token by token, for tests)."""
    return ssd_varlen(x, dt, A, B, C, D, varlen, state_pool, varlen.state_indices,
                      chunked=not (varlen.decode_only or recurrent))


def selective_scan_varlen(x, dt, A, B, C, Dskip, cu_seqlens, state_pool, state_indices):
    """Packed sequences: x [N, D]; dt [N, D] (after softplus); A [D, N_s]; B, C [N, N_s];
    Dskip [D] or None; state_pool [S, D, N_s] fp32 advanced in place at state_indices
    [n]. Returns y [N, D]."""
    impl = _fast("mamba1.triton_scan") if use_triton(x) else scan_ref
    return impl.selective_scan_varlen(x, dt, A, B, C, Dskip, cu_seqlens, state_pool,
                                      state_indices)


def step_mamba1(x, dt, A, B, C, Dskip, state_pool, varlen):
    """One call per Mamba layer for a whole step of packed sequences."""
    return selective_scan_varlen(x, dt, A, B, C, Dskip, varlen, state_pool,
                                 varlen.state_indices)
