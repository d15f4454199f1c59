"""Qwen3.5's vision tower: patches of one or more images -> one embedding per merged
2 x 2 patch block, in the text model's hidden size.

Reads top to bottom: PatchEmbed -> position embeddings -> VisionBlock (LayerNorm,
attention with 2-D rotary positions within each image, LayerNorm, GELU MLP) ->
PatchMerger (LayerNorm, the 4 patches of a block side by side, MLP). Patches arrive in
the processor's order (model/vision/image.py): merge blocks row by row, the 2 x 2
patches of a block one after another, so the merger's groups are consecutive rows.
Names follow transformers' Qwen3_5VisionModel (`model.visual.*`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ckptd.model.vision.config import VisionConfig


class PatchEmbed(nn.Module):
    """A Conv3d whose stride is its kernel: one linear map of each flattened patch
    [C * T * P * P] (the weight keeps the checkpoint's [hidden, C, T, P, P] shape)."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size,
                              (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size),
                              stride=(cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight
        return F.linear(x.to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.heads, self.d = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                lengths: list[int]) -> torch.Tensor:
        """x [N, hidden] of images of `lengths` patches each; cos, sin [N, head_dim]."""
        N = x.shape[0]
        q, k, v = self.qkv(x).view(N, 3, self.heads, self.d).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = []
        for qi, ki, vi in zip(q.split(lengths), k.split(lengths), v.split(lengths)):
            # each image attends within itself, both ways: [1, heads, n, d]
            o = F.scaled_dot_product_attention(qi.transpose(0, 1)[None], ki.transpose(0, 1)[None],
                                               vi.transpose(0, 1)[None])
            out.append(o[0].transpose(0, 1))
        return self.proj(torch.cat(out).reshape(N, -1))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary over the whole head, in fp32 (x [N, heads, d])."""
    dtype = x.dtype
    x = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos[:, None] + rotated * sin[:, None]).to(dtype)


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.approximate = "tanh" if cfg.hidden_act == "gelu_pytorch_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x, cos, sin, lengths):
        x = x + self.attn(self.norm1(x), cos, sin, lengths)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """LayerNorm each patch, then the merge x merge patches of a block side by side
    through an MLP (exact GELU) into the text model's hidden size."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.width = cfg.hidden_size * cfg.spatial_merge_size ** 2
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.linear_fc2 = nn.Linear(self.width, cfg.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x).reshape(-1, self.width)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionModel(nn.Module):
    """forward(patches [N, patch_dim], grids [(t, h, w)] in patches) -> [N / merge^2,
    out_hidden_size]: the embeddings of every image's placeholder tokens, in order."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.config = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size,
                                      _weight=torch.empty(cfg.num_position_embeddings,
                                                          cfg.hidden_size))
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg)

    @property
    def dtype(self) -> torch.dtype:
        return self.merger.linear_fc2.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.merger.linear_fc2.weight.device

    @torch.inference_mode()
    def forward(self, patches: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        cfg = self.config
        if patches.shape != (sum(t * h * w for t, h, w in grids), cfg.patch_dim):
            raise ValueError(f"patches of shape {tuple(patches.shape)} for grids {grids}")
        x = self.patch_embed(patches.to(self.device))
        rows, cols = _block_order(grids, cfg.spatial_merge_size, self.device)
        x = x + self._positions(grids, rows, cols).to(x.dtype)
        cos, sin = _rotary(rows, cols, cfg.head_dim, cfg.rope_theta)
        lengths = [h * w for t, h, w in grids for _ in range(t)]   # frames attend alone
        for block in self.blocks:
            x = block(x, cos, sin, lengths)
        return self.merger(x)

    def _positions(self, grids, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The learned side x side position grid resampled (bilinear, corners aligned)
        to each image's h x w patches: [N, hidden]."""
        side = self.config.grid_side
        heights = torch.cat([torch.full((t * h * w,), h) for t, h, w in grids]).to(rows.device)
        widths = torch.cat([torch.full((t * h * w,), w) for t, h, w in grids]).to(rows.device)
        (h0, h1, dh), (w0, w1, dw) = _taps(rows, heights, side), _taps(cols, widths, side)
        table = self.pos_embed.weight
        out = 0
        for hi, hw in ((h0, 1 - dh), (h1, dh)):
            for wi, ww in ((w0, 1 - dw), (w1, dw)):
                out = out + table[hi * side + wi].float() * (hw * ww)[:, None]
        return out


def _taps(index: torch.Tensor, size: torch.Tensor, side: int):
    """Bilinear taps on an axis of `side` learned entries for positions `index` of an
    axis `size` long, corners aligned: (lower tap, upper tap, weight of the upper)."""
    src = index.float() * (side - 1) / (size - 1).clamp(min=1).float()
    lo = src.floor()
    return lo.long(), (lo.long() + 1).clamp(max=side - 1), src - lo


def _block_order(grids, merge: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column (in patches) of every patch, in the processor's order: merge
    blocks row by row, the patches of a block row by row, frame after frame."""
    rows, cols = [], []
    for t, h, w in grids:
        r = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
        c = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
        rows.append(r.transpose(1, 2).reshape(-1).repeat(t))
        cols.append(c.transpose(1, 2).reshape(-1).repeat(t))
    return torch.cat(rows).to(device), torch.cat(cols).to(device)


def _rotary(rows: torch.Tensor, cols: torch.Tensor, head_dim: int, theta: float):
    """cos, sin [N, head_dim] of the 2-D rotary: a quarter of the head's frequencies
    turn with the row, a quarter with the column, and rotate-half repeats the half."""
    spatial = head_dim // 2
    inv = 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float32,
                                        device=rows.device) / spatial))
    freqs = torch.cat([rows.float()[:, None] * inv, cols.float()[:, None] * inv], dim=-1)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()
