"""Turning ``model=`` into a loaded model: resolving the source (``model_source.load_model``: the embedded default,
an HF directory, an orbax checkpoint, ``random:<preset>``), reading HF safetensors and orbax checkpoints
(``loader``), and pre-quantized formats (``quantized_hf``: FP8 HF checkpoints; ``quantized_orbax``: what
``jaxinfer convert --quantization`` writes)."""
