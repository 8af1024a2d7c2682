"""Structured-output benchmarks: a JSON-schema suite, a Qwen-sized test tokenizer, and grammar mask costs."""
