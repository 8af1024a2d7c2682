"""Quantization: the quantized weight and its matmul (``quantized_weight``), the FP8 KV cache (``kv_cache``), and
the engine's ``quantization=`` / ``kv_cache_dtype=`` options, checked before anything loads (``options``)."""
