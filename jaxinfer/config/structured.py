"""The ``structured_outputs_config`` dict of ``LLM(...)``, validated into a frozen StructuredOutputsConfig.

* ``backend``: "auto" (llguidance when it is installed and the model has a tokenizer, else structured outputs
  are refused per request with the reason), "guidance" (llguidance, or the engine does not start), or
  "disabled" (no masked token choosers are compiled; constrained requests are refused);
* ``jump_forward`` (True): append the tokens a grammar forces without a decode step each
  (``jaxinfer.core.output_processor``; the output is the same token for token either way);
* ``whitespace_pattern`` (None): the regex of the whitespace a JSON output may contain between its tokens;
  None allows none (compact JSON, as ``json.dumps(separators=(",", ":"))`` writes it: no output token is spent
  on layout, and a model cannot loop on whitespace). A request's own
  ``StructuredOutputsParams.whitespace_pattern`` takes precedence.
"""

from __future__ import annotations

import dataclasses
from typing import Any

BACKENDS = ("auto", "guidance", "disabled")


@dataclasses.dataclass(frozen=True)
class StructuredOutputsConfig:
    backend: str = "auto"
    jump_forward: bool = True
    whitespace_pattern: str | None = None

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"structured_outputs_config['backend'] must be one of {BACKENDS}, got {self.backend!r}")
        if not isinstance(self.jump_forward, bool):
            raise ValueError(f"structured_outputs_config['jump_forward'] must be a bool, got {self.jump_forward!r}")
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise ValueError("structured_outputs_config['whitespace_pattern'] must be a regex string or None")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "StructuredOutputsConfig":
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ValueError(f"structured_outputs_config must be a dict, got {type(d).__name__}")
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"structured_outputs_config: unknown key(s) {unknown}; valid: "
                             f"{[f.name for f in dataclasses.fields(cls)]}")
        return cls(**d)
