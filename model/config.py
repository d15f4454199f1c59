"""Model configuration, built from a Hugging Face config.json dict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ckptd.model.spec import AttentionSpec, RecurrentSpec, StateSpec

ARCHS = ("llama", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
# multimodal checkpoints whose text model we serve: model_type -> the text_config's
NESTED = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
# the selective state space hybrids: model/ssm_config.py (SSMConfig, a ModelConfig)
SSM_ARCHS = ("nemotron_h", "granitemoehybrid", "falcon_h1", "mamba2", "jamba")
# sliding-window attention models: model/gemma_config.py (GemmaConfig, a ModelConfig)
GEMMA_ARCHS = ("gemma3_text",)
# gpt-oss: model/gpt_oss_config.py (GptOssConfig, a ModelConfig)
GPT_OSS_ARCHS = ("gpt_oss",)
SUPPORTED = ARCHS + tuple(NESTED) + SSM_ARCHS + GEMMA_ARCHS + GPT_OSS_ARCHS
LAYER_KINDS = ("full_attention", "linear_attention")
MLP_KINDS = ("dense", "moe")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_dtype(name: str) -> None:
    """Every config's dtype check (ModelConfig and the SSM and Gemma configs)."""
    if name not in _DTYPES:
        raise ValueError(f"config: unsupported dtype {name!r}")


def hf_fields(d: dict, *, eps: float, tie: bool, bias: bool, max_pos: int) -> dict:
    """The ModelConfig fields that config.json names alike in the families read here,
    in model/gemma_config.py and in model/gpt_oss_config.py (transformers' keys): sizes,
    heads, the norm's epsilon, token ids, dtype. Where a key is absent each family has
    its own default: eps, tie (tie_word_embeddings), bias (attention_bias), max_pos."""
    hidden = int(d["hidden_size"])
    heads = int(d["num_attention_heads"])
    eos = d.get("eos_token_id")
    dtype = str(d.get("dtype") or d.get("torch_dtype") or "float32")
    return dict(
        arch=d["model_type"],
        vocab_size=int(d["vocab_size"]),
        hidden_size=hidden,
        num_layers=int(d["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or hidden // heads),
        rms_norm_eps=float(d.get("rms_norm_eps", eps)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", tie)),
        attention_bias=bool(d.get("attention_bias", bias)),
        max_position_embeddings=int(d.get("max_position_embeddings", max_pos)),
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None
                                                                else (int(eos),)),
        dtype=dtype if dtype in _DTYPES else "float32",
    )


class LayerKinds:
    """A mixin for the configs of other families than Qwen's (model/ssm_config.py,
    model/window_config.py): which layers keep attention KV and which a recurrent state
    is said by each layer's kind."""
    ATTENTION: ClassVar[tuple[str, ...]] = ()
    RECURRENT: ClassVar[tuple[str, ...]] = ()

    @property
    def qwen(self) -> bool:
        return False

    @property
    def n_attention(self) -> int:
        return sum(t in self.ATTENTION for t in self.layer_types)

    @property
    def n_recurrent(self) -> int:
        return sum(t in self.RECURRENT for t in self.layer_types)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    # M-RoPE: rotary pairs per axis (temporal, height, width), interleaved; () for none
    mrope_section: tuple[int, ...] = ()
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 8192
    # Gated DeltaNet (linear_attention layers)
    linear_conv_kernel: int = 4
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    # sparse mixture of experts: each layer's MLP is "dense" or "moe" (default all dense)
    mlp_types: tuple[str, ...] = ()
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "float32"
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(unsupported(self.arch))
        if not self.mlp_types:
            object.__setattr__(self, "mlp_types", ("dense",) * self.num_layers)
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"config: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"config: num_attention_heads {self.num_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_kv_heads}")
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"config: layer_types has {len(self.layer_types)} entries for "
                             f"{self.num_layers} layers")
        bad = set(self.layer_types) - set(LAYER_KINDS)
        if bad:
            raise ValueError(f"config: unknown layer type(s) {sorted(bad)}")
        if self.arch == "llama" and "linear_attention" in self.layer_types:
            raise ValueError("config: llama has no linear_attention layers")
        if "linear_attention" in self.layer_types:
            for name in ("linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                         "linear_num_value_heads", "linear_conv_kernel"):
                if getattr(self, name) <= 0:
                    raise ValueError(f"config: {name} must be positive for linear attention")
            if self.linear_num_value_heads % self.linear_num_key_heads:
                raise ValueError("config: linear_num_value_heads must be a multiple of "
                                 "linear_num_key_heads")
        self._check_mlp()
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(f"config: rotary dim {self.rotary_dim} must be even and <= head_dim")
        check_dtype(self.dtype)

    def _check_mlp(self) -> None:
        if len(self.mlp_types) != self.num_layers:
            raise ValueError(f"config: {len(self.mlp_types)} MLP kinds for {self.num_layers} "
                             "layers")
        bad = set(self.mlp_types) - set(MLP_KINDS)
        if bad:
            raise ValueError(f"config: unknown MLP kind(s) {sorted(bad)}")
        if "dense" in self.mlp_types and self.intermediate_size <= 0:
            raise ValueError(f"config: intermediate_size must be positive, "
                             f"got {self.intermediate_size}")
        if "moe" not in self.mlp_types:
            return
        if self.arch not in ("qwen3_5_moe_text", "qwen3_next"):
            raise ValueError(f"config: {self.arch} has no mixture-of-experts layers")
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"config: {name} must be positive for MoE layers, "
                                 f"got {getattr(self, name)}")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"config: num_experts_per_tok {self.num_experts_per_tok} exceeds "
                             f"num_experts {self.num_experts}")
        if self.shared_expert_intermediate_size < 0:
            raise ValueError("config: shared_expert_intermediate_size must not be negative")

    @classmethod
    def from_hf(cls, d: dict) -> ModelConfig:
        """Build from a Hugging Face config.json dict: llama, qwen3_5_text,
        qwen3_5_moe_text, qwen3_next, or qwen3_5 / qwen3_5_moe with a nested text_config
        (a state space hybrid's is configs.config_from_hf's)."""
        d = text_config(d)
        model_type = d["model_type"]
        try:
            base = hf_fields(d, eps=1e-6, tie=False, bias=False, max_pos=8192)
            n_layers = base["num_layers"]
            rope = d.get("rope_parameters") or {}
            if model_type != "llama":
                types = d.get("layer_types") or [
                    "full_attention" if (i + 1) % int(d.get("full_attention_interval", 4)) == 0
                    else "linear_attention" for i in range(n_layers)]
                partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 0.25))
            else:
                types = ["full_attention"] * n_layers
                partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
            return cls(
                **base,
                # Qwen3.5-MoE has no dense MLP, and no intermediate_size
                intermediate_size=int(d["intermediate_size"] if model_type != "qwen3_5_moe_text"
                                      else d.get("intermediate_size") or 0),
                layer_types=tuple(types),
                rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
                partial_rotary_factor=float(partial),
                mrope_section=_mrope(model_type, rope),
                linear_conv_kernel=int(d.get("linear_conv_kernel_dim", 4)),
                linear_key_head_dim=int(d.get("linear_key_head_dim", 0)),
                linear_value_head_dim=int(d.get("linear_value_head_dim", 0)),
                linear_num_key_heads=int(d.get("linear_num_key_heads", 0)),
                linear_num_value_heads=int(d.get("linear_num_value_heads", 0)),
                **_moe_fields(d, n_layers),
                raw=dict(d),
            )
        except KeyError as e:
            raise ValueError(f"config.json is missing {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            if isinstance(e, ValueError) and str(e).startswith("config"):
                raise
            raise ValueError(f"config.json has a value of the wrong type: {e}") from None

    @property
    def qwen(self) -> bool:
        """The Qwen3.5 / Qwen3-Next family: zero-centred norms, gated attention."""
        return self.arch != "llama"

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def n_attention(self) -> int:
        return self.layer_types.count("full_attention")

    @property
    def n_recurrent(self) -> int:
        return self.layer_types.count("linear_attention")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def state_spec(self, block_size: int, dtype: torch.dtype = torch.float32) -> StateSpec:
        """The state layout for a model computing in `dtype`."""
        attn = AttentionSpec(self.n_attention, self.num_kv_heads, self.head_dim, dtype) \
            if self.n_attention else None
        rec = None
        if self.n_recurrent:
            key_dim = self.linear_key_head_dim * self.linear_num_key_heads
            value_dim = self.linear_value_head_dim * self.linear_num_value_heads
            rec = RecurrentSpec(self.n_recurrent, 2 * key_dim + value_dim, self.linear_conv_kernel,
                                self.linear_num_value_heads, self.linear_key_head_dim,
                                self.linear_value_head_dim, conv_dtype=dtype)
        return StateSpec(block_size, attn, rec)


def unsupported(model_type) -> str:
    return (f"unsupported architecture {model_type!r} "
            f"(supported: {', '.join(SUPPORTED)})")


def text_config(d: dict) -> dict:
    """The text model's config dict: d itself, or a multimodal checkpoint's text_config
    with its model_type. ValueError naming an unsupported architecture; this reads only
    config.json, so a folder is refused before any weight is read."""
    if not isinstance(d, dict):
        raise ValueError("config.json must hold a JSON object")
    model_type = d.get("model_type")
    if model_type in NESTED:
        inner = d.get("text_config")
        if not isinstance(inner, dict):
            raise ValueError(f"config.json: model_type {model_type!r} needs a text_config object")
        # the text config inherits what the outer config sets and it does not
        extra = {k: d[k] for k in ("tie_word_embeddings",) if k in d and k not in inner}
        return {**inner, **extra, "model_type": NESTED[model_type]}
    if model_type not in ARCHS:
        raise ValueError(unsupported(model_type))
    return d


def _mrope(model_type: str, rope: dict) -> tuple[int, ...]:
    """Qwen3.5's M-RoPE sections; transformers' Qwen3_5TextRotaryEmbedding takes
    [11, 11, 10] where the config names none. Only image tokens tell them apart."""
    if model_type not in ("qwen3_5_text", "qwen3_5_moe_text"):
        return ()
    return tuple(int(s) for s in rope.get("mrope_section") or (11, 11, 10))


def _moe_fields(d: dict, n_layers: int) -> dict:
    """The MoE fields of a Qwen3.5-MoE / Qwen3-Next config (none for the dense archs).

    Qwen3.5-MoE: every layer is sparse and the top-k weights are always renormalised
    (transformers' Qwen3_5MoeTopKRouter has no switch). Qwen3-Next: layer i is sparse
    unless listed in mlp_only_layers or (i + 1) is not a multiple of decoder_sparse_step;
    norm_topk_prob says whether to renormalise."""
    model_type = d["model_type"]
    if model_type not in ("qwen3_5_moe_text", "qwen3_next"):
        return {}
    experts = int(d.get("num_experts") or 0)
    if model_type == "qwen3_5_moe_text":
        kinds = ["moe"] * n_layers
        norm = True
    else:
        step = int(d.get("decoder_sparse_step") or 1)
        only = {int(i) for i in d.get("mlp_only_layers") or []}
        kinds = ["moe" if i not in only and experts > 0 and (i + 1) % step == 0 else "dense"
                 for i in range(n_layers)]
        norm = bool(d.get("norm_topk_prob", True))
    return {
        "mlp_types": tuple(kinds),
        "num_experts": experts,
        "num_experts_per_tok": int(d.get("num_experts_per_tok") or 0),
        "moe_intermediate_size": int(d.get("moe_intermediate_size") or 0),
        "shared_expert_intermediate_size": int(d.get("shared_expert_intermediate_size") or 0),
        "norm_topk_prob": norm,
    }
