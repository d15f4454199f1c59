"""LoRA adapters, applied unmerged (model/lora/apply.py), read from llama.cpp's GGUF
adapters or PEFT folders (model/lora/adapter.py)."""
