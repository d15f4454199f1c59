"""config.json -> the configuration class of its architecture: a state space hybrid
(SSM_ARCHS) gives an SSMConfig (ssm_config.py), Gemma 3 (GEMMA_ARCHS) a GemmaConfig
(gemma_config.py), gpt-oss a GptOssConfig (gpt_oss_config.py), every other one a
ModelConfig."""

from __future__ import annotations

from ckptd.model.config import GEMMA_ARCHS, GPT_OSS_ARCHS, SSM_ARCHS, ModelConfig
from ckptd.model.gemma_config import GemmaConfig
from ckptd.model.gpt_oss_config import GptOssConfig
from ckptd.model.ssm_config import SSMConfig


def config_from_hf(d: dict) -> ModelConfig:
    """The config of a Hugging Face config.json dict (or what the GGUF loader makes of a
    GGUF's metadata); ValueError naming an unsupported architecture or a bad key."""
    if isinstance(d, dict) and d.get("model_type") in SSM_ARCHS:
        return SSMConfig.from_hf(d)
    if isinstance(d, dict) and d.get("model_type") in GEMMA_ARCHS:
        return GemmaConfig.from_hf(d)
    if isinstance(d, dict) and d.get("model_type") in GPT_OSS_ARCHS:
        return GptOssConfig.from_hf(d)
    return ModelConfig.from_hf(d)
