"""Streamed deltas of one completion: the text, token ids and logprobs not sent yet.

The engine reports each completion's whole text so far. When a stop string ends the completion, the engine
cuts the text where the stop string starts, which may be inside text reported a step earlier: so while stop
strings are active and the completion runs, the last ``len(longest stop string) - 1`` characters are held
back (what vLLM does). A match is only searched where it ends in newly generated text, so the cut is never
before what was sent, and the concatenated deltas equal the final text exactly.
"""

from __future__ import annotations

from jaxinfer.outputs import CompletionOutput


class CompletionDeltas:
    def __init__(self, stop: tuple[str, ...] | list[str] | None):
        longest = max((len(s) for s in stop or ()), default=0)
        self.hold = max(longest - 1, 0)
        self.sent_chars = 0
        self.sent_tokens = 0

    def next(self, comp: CompletionOutput) -> tuple[str, list[int], list | None]:
        """(new text, new token ids, their logprobs or None) since the previous call."""
        text = comp.text
        end = len(text) if comp.finish_reason is not None else max(self.sent_chars, len(text) - self.hold)
        delta = text[self.sent_chars:end]
        self.sent_chars = max(self.sent_chars, end)
        ids = comp.token_ids[self.sent_tokens:]
        logprobs = comp.logprobs[self.sent_tokens:] if comp.logprobs is not None else None
        self.sent_tokens = len(comp.token_ids)
        return delta, ids, logprobs
