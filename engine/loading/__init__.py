"""Loading models: local folders, the default model's provisioning from its GGUF, tokenizers and configs."""
