"""The OpenAI-compatible API: /v1/models, /v1/chat/completions and /v1/completions, with tools and structured
output."""
