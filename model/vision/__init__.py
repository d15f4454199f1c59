"""Image input for Qwen3.5 / Qwen3.5-MoE (Qwen3.6 is the same): the vision encoder,
the image preprocessing of the model's own processor, M-RoPE positions, and loading
from a multimodal HF checkpoint or llama.cpp's mmproj GGUF.

    config.py     VisionConfig (the tower) and Processing (resize bounds, mean, std)
    image.py      bytes -> decoded RGB -> resized to the patch grid -> patches
    encoder.py    VisionModel: patch embedding, vision blocks, patch merger
    positions.py  ImageSpan (an image's placeholder tokens) and their M-RoPE positions
    load.py       the tower from `model.visual.*` or an mmproj GGUF
    embedder.py   the encoder's output per image, cached by the image's digest
"""
