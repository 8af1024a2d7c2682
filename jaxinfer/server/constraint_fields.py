"""A request's structured-output constraint from its fields: ``response_format`` (``text``, ``json_object``,
``json_schema``), vLLM's ``structured_outputs`` object, and the older ``guided_json`` / ``guided_regex`` /
``guided_choice`` / ``guided_grammar`` as its aliases (``guided_whitespace_pattern`` applies to any of them).
At most one per request; every problem is a ``FieldError`` naming the field that caused it."""

from __future__ import annotations

from typing import Any

from jaxinfer.sampling_params import StructuredOutputsParams
from jaxinfer.server.field_error import FieldError

STRUCTURED_KEYS = frozenset({"json", "regex", "choice", "grammar", "json_object", "whitespace_pattern"})
ALIASES = (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
           ("guided_grammar", "grammar"))


def _from_response_format(rf: dict) -> dict | None:
    kind = rf.get("type")
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
            raise FieldError("response_format.json_schema", "response_format.json_schema must be an object with a "
                                                            "'schema' (a JSON schema object)")
        # strict or not, the schema is enforced (as vLLM does); a missing schema allows any JSON value
        return {"json": spec.get("schema", {})}
    if kind != "text":
        raise FieldError("response_format.type", f"response_format.type must be 'text', 'json_object' or "
                                                 f"'json_schema', got {kind!r}")
    return None


def constraint_of(body: Any) -> StructuredOutputsParams | None:
    """The constraint of a completions or chat body (``protocol._Sampling``), or None."""
    found: list[tuple[str, dict]] = []
    if body.response_format is not None:
        kwargs = _from_response_format(body.response_format)
        if kwargs is not None:
            found.append(("response_format", kwargs))
    if body.structured_outputs is not None:
        unknown = sorted(set(body.structured_outputs) - STRUCTURED_KEYS)
        if unknown:
            raise FieldError(f"structured_outputs.{unknown[0]}", f"structured_outputs.{unknown[0]} is not supported "
                                                                 f"(supported: {sorted(STRUCTURED_KEYS)})")
        found.append(("structured_outputs", {k: v for k, v in body.structured_outputs.items() if v is not None}))
    for alias, key in ALIASES:
        if getattr(body, alias) is not None:
            found.append((alias, {key: getattr(body, alias)}))
    if not found:
        return None
    if len(found) > 1:
        raise FieldError(found[1][0], f"give one constraint per request: {found[0][0]} and {found[1][0]} were "
                                      "both given")
    field, kwargs = found[0]
    if body.guided_whitespace_pattern is not None:
        kwargs.setdefault("whitespace_pattern", body.guided_whitespace_pattern)
    try:
        return StructuredOutputsParams(**kwargs)
    except ValueError as exc:
        raise FieldError(field, str(exc).replace("structured_outputs", field, 1)) from None
