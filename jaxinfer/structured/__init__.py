"""Structured outputs: constrain generation to a JSON schema, a regex, a choice or a grammar.

``backend.GrammarBackend`` compiles a request's ``StructuredOutputsParams`` for the model's tokenizer (with
llguidance); each constrained sequence carries a ``matcher.GrammarMatcher`` that advances with every token it
emits and gives the bitmask of the tokens allowed next (``bitmask``), which the jitted token chooser applies to
the logits. Host side: no JAX here.
"""
