"""What the sliding-window models' configs share (gemma_config.py, gpt_oss_config.py):
every layer attention, `sliding_attention` (the query at p sees keys p - W + 1 .. p) or
`full_attention`, each layer's KV pages kept like a full layer's (a restore at any
prefix is exact); the same checks on the attention fields, and from_hf's errors."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ckptd.model.config import LayerKinds, check_dtype
from ckptd.model.spec import AttentionSpec, StateSpec

KINDS = ("sliding_attention", "full_attention")


class WindowedAttention(LayerKinds):
    """A mixin for a ModelConfig dataclass with a `sliding_window` field."""
    ATTENTION = KINDS

    def check_attention(self, positive: tuple[str, ...]) -> None:
        """ValueError naming the first bad field: `positive` (and the attention sizes)
        not positive, heads not a multiple of kv heads, unknown layer kinds, no window
        for window layers, an odd head dim, an unsupported dtype."""
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", *positive):
            if getattr(self, name) <= 0:
                raise ValueError(f"config: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"config: num_attention_heads {self.num_heads} is not a multiple "
                             f"of num_key_value_heads {self.num_kv_heads}")
        if len(self.layer_types) != self.num_layers or set(self.layer_types) - set(KINDS):
            raise ValueError(f"config: layer_types must name {self.num_layers} layers, each "
                             f"one of {', '.join(KINDS)}; got {list(self.layer_types)}")
        if "sliding_attention" in self.layer_types and self.sliding_window <= 0:
            raise ValueError(f"config: sliding_window must be positive, got {self.sliding_window}")
        if self.head_dim % 2:
            raise ValueError(f"config: head_dim {self.head_dim} must be even")
        check_dtype(self.dtype)

    def window(self, layer: int) -> int:
        """Keys a query of `layer` sees (its own included); 0: all of them."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else 0

    def state_spec(self, block_size: int, dtype: torch.dtype = torch.float32) -> StateSpec:
        windows = tuple(self.window(i) for i in range(self.num_layers))
        return StateSpec(block_size, AttentionSpec(self.num_layers, self.num_kv_heads,
                                                   self.head_dim, dtype,
                                                   windows if any(windows) else ()), None)


def config_of(cls, d: dict, fields: Callable[[dict], dict]):
    """cls(**fields(d), raw=d): ValueError naming a missing or mistyped key."""
    try:
        return cls(**fields(d), raw=dict(d))
    except KeyError as e:
        raise ValueError(f"config.json is missing {e.args[0]!r}") from None
    except TypeError as e:                # int(None), float([...]), ...
        raise ValueError(f"config.json has a value of the wrong type: {e}") from None
