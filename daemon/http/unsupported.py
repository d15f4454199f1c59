"""llama-server routes ckptd leaves out: each answers 501 naming what it is."""

from __future__ import annotations

UNSUPPORTED = {
    ("POST", "/embedding"): "embeddings", ("POST", "/embeddings"): "embeddings",
    ("POST", "/v1/embeddings"): "embeddings", ("POST", "/rerank"): "reranking",
    ("POST", "/reranking"): "reranking", ("POST", "/v1/rerank"): "reranking",
    ("POST", "/v1/reranking"): "reranking",
    ("POST", "/v1/audio/transcriptions"): "audio input (multimodal)",
    ("POST", "/audio/transcriptions"): "audio input (multimodal)",
    ("POST", "/models/load"): "router mode (loading models)",
    ("POST", "/models/unload"): "router mode (unloading models)",
    ("GET", "/cors-proxy"): "tool/MCP proxying",
    ("POST", "/cors-proxy"): "tool/MCP proxying", ("GET", "/tools"): "tool/MCP proxying",
    ("POST", "/tools"): "tool/MCP proxying",
}


