"""Speculative decoding: one ``Proposer`` interface (``proposer``) with two implementations — prompt lookup
(``ngram``, host side) and a draft model (``draft_model``) — the adaptive choice of k (``controller``) and the
engine-side loop around them (``speculator``). Host-side modules import no JAX; ``draft_model`` runs the draft
through a ``jaxinfer.runner.model_runner.ModelRunner``."""
