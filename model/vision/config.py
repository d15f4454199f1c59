"""The vision tower's configuration and the image processor's, from a Hugging Face
multimodal config.json (+ preprocessor_config.json) or an mmproj GGUF's metadata."""

from __future__ import annotations

from dataclasses import dataclass, field

# transformers' Qwen2VLImageProcessor defaults, which Qwen3.5's processor config keeps
# (size.shortest_edge / longest_edge are pixel counts, not edges)
MIN_PIXELS = 65536
MAX_PIXELS = 16777216
_ACTS = ("gelu_pytorch_tanh", "gelu")


@dataclass(frozen=True)
class Processing:
    """How an image becomes patches (transformers' Qwen2VLImageProcessor): resized to a
    multiple of patch_size * merge_size on each side, its pixel count within
    [min_pixels, max_pixels], then scaled to [0, 1] and normalised by mean and std."""
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def __post_init__(self) -> None:
        for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels",
                     "max_pixels"):
            if getattr(self, name) <= 0:
                raise ValueError(f"image processor: {name} must be positive")
        if self.min_pixels > self.max_pixels:
            raise ValueError("image processor: min_pixels exceeds max_pixels")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError("image processor: image_mean and image_std take 3 values, "
                             "std positive")

    @property
    def factor(self) -> int:
        """Both sides of a resized image are multiples of this."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_hf(cls, d: dict | None) -> Processing:
        """From preprocessor_config.json (absent: the processor's defaults)."""
        d = d or {}
        size = d.get("size") or {}
        try:
            return cls(
                patch_size=int(d.get("patch_size", 16)),
                temporal_patch_size=int(d.get("temporal_patch_size", 2)),
                merge_size=int(d.get("merge_size", 2)),
                min_pixels=int(d.get("min_pixels") or size.get("shortest_edge") or MIN_PIXELS),
                max_pixels=int(d.get("max_pixels") or size.get("longest_edge") or MAX_PIXELS),
                mean=tuple(float(x) for x in d.get("image_mean", (0.5, 0.5, 0.5))),
                std=tuple(float(x) for x in d.get("image_std", (0.5, 0.5, 0.5))))
        except (TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"preprocessor_config.json: {e}") from None


@dataclass(frozen=True)
class VisionConfig:
    """Qwen3.5's vision tower (transformers: Qwen3_5VisionConfig) and the placeholder
    tokens of the text model it feeds."""
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    num_position_embeddings: int
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0
    layer_norm_eps: float = 1e-6
    image_token_id: int = -1
    vision_start_token_id: int = -1
    vision_end_token_id: int = -1
    processing: Processing = field(default_factory=Processing)

    def __post_init__(self) -> None:
        for name in ("depth", "hidden_size", "num_heads", "intermediate_size",
                     "out_hidden_size", "num_position_embeddings", "patch_size",
                     "temporal_patch_size", "spatial_merge_size", "in_channels"):
            if getattr(self, name) <= 0:
                raise ValueError(f"vision config: {name} must be positive, "
                                 f"got {getattr(self, name)}")
        if self.hidden_size % self.num_heads or self.head_dim % 4:
            raise ValueError("vision config: hidden_size / num_heads must be a multiple of 4")
        if int(self.num_position_embeddings ** 0.5) ** 2 != self.num_position_embeddings:
            raise ValueError("vision config: num_position_embeddings must be a square")
        if self.hidden_act not in _ACTS:
            raise ValueError(f"vision config: unsupported hidden_act {self.hidden_act!r}")
        p = self.processing
        if (p.patch_size, p.temporal_patch_size, p.merge_size) != \
                (self.patch_size, self.temporal_patch_size, self.spatial_merge_size):
            raise ValueError("the image processor's patch, temporal patch and merge sizes "
                             "differ from the vision tower's")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def grid_side(self) -> int:
        """Side of the square grid of learned position embeddings."""
        return int(self.num_position_embeddings ** 0.5)

    @property
    def patch_dim(self) -> int:
        """Values per patch: channels x temporal patch x patch x patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @classmethod
    def from_hf(cls, d: dict, preprocessor: dict | None = None) -> VisionConfig | None:
        """From a multimodal config.json (qwen3_5 / qwen3_5_moe); None when it has no
        vision_config (a text-only checkpoint)."""
        v = d.get("vision_config") if isinstance(d, dict) else None
        if not isinstance(v, dict):
            return None
        rope = v.get("rope_parameters") or {}
        try:
            proc = Processing.from_hf(preprocessor)
            return cls(
                depth=int(v["depth"]), hidden_size=int(v["hidden_size"]),
                num_heads=int(v["num_heads"]), intermediate_size=int(v["intermediate_size"]),
                out_hidden_size=int(v["out_hidden_size"]),
                num_position_embeddings=int(v.get("num_position_embeddings", 2304)),
                patch_size=int(v.get("patch_size", 16)),
                temporal_patch_size=int(v.get("temporal_patch_size", 2)),
                spatial_merge_size=int(v.get("spatial_merge_size", 2)),
                in_channels=int(v.get("in_channels", 3)),
                hidden_act=str(v.get("hidden_act", "gelu_pytorch_tanh")),
                rope_theta=float(rope.get("rope_theta", 10000.0)),
                image_token_id=int(d.get("image_token_id", 248056)),
                vision_start_token_id=int(d.get("vision_start_token_id", 248053)),
                vision_end_token_id=int(d.get("vision_end_token_id", 248054)),
                processing=proc)
        except KeyError as e:
            raise ValueError(f"config.json: vision_config is missing {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            if str(e).startswith(("vision config", "image processor", "the image",
                                  "preprocessor")):
                raise
            raise ValueError(f"config.json: vision_config has a bad value: {e}") from None
