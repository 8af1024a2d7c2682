"""Choosing tokens on the device: the sampler (``sampler``: penalties, bans, temperature, top-k/p, min-p, seeded
draws, logprobs) and the lossless verification of speculative tokens (``rejection_sampler``)."""
