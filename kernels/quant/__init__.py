"""GGUF weights kept in their block formats: dequantize inside the matmul."""
