"""`pagedchat bench make-gguf`: realistic random-weight GGUF files (Llama/Qwen2 shapes, llama-quantize's type mixes)."""
