"""The models the compile gate runs (their layer shapes, a few layers each) and the steps
it runs them through.

Shapes are the released models' (transformers' default configs for Qwen3.5 / Qwen3-Next
are the flagship ones): what decides a kernel's launch is a layer's head dims and head
counts, which these few layers have, and the step's shape (below). Depth and vocabulary
are runtime ints of every kernel: they change no compile.
"""

from __future__ import annotations

_QWEN = {"rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "tie_word_embeddings": False,
         "attention_bias": False, "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1,
         "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
         "linear_num_key_heads": 16, "linear_num_value_heads": 32,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0,
                             "partial_rotary_factor": 0.25}}
# three Gated DeltaNet layers and one full attention layer, as the models repeat them
_HYBRID = ["linear_attention"] * 3 + ["full_attention"]

MODELS: dict[str, dict] = {
    # Qwen3.5-35B-A3B / Qwen3.6-35B-A3B (one architecture)
    "qwen3.5-35b-a3b": {
        **_QWEN, "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048,
        "num_hidden_layers": 4, "layer_types": _HYBRID, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 256, "num_experts": 256,
        "num_experts_per_tok": 8, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "norm_topk_prob": True},
    # Qwen3-Next-80B-A3B
    "qwen3-next-80b-a3b": {
        **_QWEN, "model_type": "qwen3_next", "vocab_size": 151936, "hidden_size": 2048,
        "intermediate_size": 5632, "num_hidden_layers": 4, "layer_types": _HYBRID,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
        "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": []},
    # Qwen3.5 dense (9B-shaped)
    "qwen3.5-dense": {
        **_QWEN, "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 4096,
        "intermediate_size": 12288, "num_hidden_layers": 4, "layer_types": _HYBRID,
        "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256},
    # SmolLM2-135M: head dim 64
    "smollm2-135m": {
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 1, "num_attention_heads": 9,
        "num_key_value_heads": 3, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}},
    # a llama of head dim 128 (Llama-3-8B-shaped)
    "llama-8b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 1, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    # gpt-oss-20b (the 120b's layers are the same shape): a 128-key window layer and a
    # full one, sinks, head dim 64
    "gpt-oss-20b": {
        "model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880,
        "intermediate_size": 2880, "num_hidden_layers": 2, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32,
        "num_experts_per_tok": 4, "sliding_window": 128, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                            "original_max_position_embeddings": 4096}},
}

# the models whose weights the gate also keeps in each GGUF format (every row a whole
# number of 256-value blocks, as the K-quants need)
KEPT_MODELS = ("qwen3.5-35b-a3b",)


# A step is a list of sequences (tokens before the step, tokens computed in it). Together
# they take every launch the dispatch picks by a step's shape: decode of one and of many
# sequences over long contexts (attention split into key ranges), a chunk beside decodes
# (few rows per expert), and long prefill chunks, fresh and after a context.
STEPS: dict[str, list[tuple[int, int]]] = {
    "decode x1 @32K": [(32768, 1)],
    "decode x32 @4K": [(4096, 1)] * 32,
    "chunk 7 + 3 decodes": [(100, 7), (900, 1), (50, 1), (3000, 1)],
    "prefill 2048": [(0, 2048)],
    "prefill 1024 @8K + 300": [(8192, 1024), (0, 300)],
}
