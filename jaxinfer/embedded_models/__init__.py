"""The embedded models that ship inside the jaxinfer package: ``default/`` and ``draft/``.

``default/`` is what ``LLM()`` loads when no ``model=`` is given, ``draft/`` a smaller model with the same
vocabulary for draft-model speculative decoding. Both are small Hugging Face Llama checkpoints
(``config.json``, ``generation_config.json``, float32 ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``, ``training_summary.json``) trained on the Python standard library's sources by
``checkpoints/train.py`` in the source tree, which writes them here; ``default/chat_template.jinja`` is kept
by hand. Living inside the package, they are carried by a wheel or a non-editable ``pip install .``. This
package holds no code; ``jaxinfer.loading.model_source`` names the two directories.
"""
