"""Frozen configurations: the model (``model.ModelConfig``, parsed from an HF ``config.json``), the engine
(``engine.EngineConfig``: every setting of ``LLM(...)``), speculation (``speculative.SpeculativeConfig``) and named
model shapes for random-weight benchmarks (``presets``)."""
