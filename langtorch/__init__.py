"""langtorch — LLM applications the PyTorch way."""
