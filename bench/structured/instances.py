"""Valid instances of the suite's JSON schemas, made deterministically by walking each schema (``make_instance``;
strings with a ``pattern`` take the schema's ``examples``), checked with ``jsonschema`` (``validate_instance``), and
their compact JSON text (``instance_text``): what ``mask_cost`` replays through the grammar backends."""

from __future__ import annotations

import json

_WORDS = ("alpha", "river", "stone", "quiet", "maple", "orbit", "lantern", "copper", "meadow", "signal", "harbor",
          "velvet", "summit", "canyon", "ember", "falcon", "glacier", "willow", "thunder", "pixel")
_FORMAT_VALUES = {
    "date": "2026-12-03",
    "date-time": "2026-12-03T14:05:09Z",
    "time": "14:05:09Z",
    "email": "ada.lovelace@example.com",
    "uuid": "3f2b8c1e-9a4d-4c7e-b5a1-2d6f0e8c9b7a",
}


def _resolve(ref: str, root: dict) -> dict:
    if not ref.startswith("#"):
        raise ValueError(f"only local $ref is supported, got {ref!r}")
    node = root
    for part in ref[1:].split("/"):
        if part:
            node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _text(length: int, seed: int) -> str:
    words, i = [], seed
    while len(" ".join(words)) < length:
        words.append(_WORDS[i % len(_WORDS)])
        i += 7
    return " ".join(words)[:length].rstrip() or "x" * length


def _bounds(schema: dict, step):
    lo = schema.get("minimum")
    if "exclusiveMinimum" in schema:
        lo = schema["exclusiveMinimum"] + step
    hi = schema.get("maximum")
    if "exclusiveMaximum" in schema:
        hi = schema["exclusiveMaximum"] - step
    return lo, hi


def make_instance(schema: dict, root: dict | None = None, index: int = 0, depth: int = 0):
    """A deterministic JSON value valid for ``schema`` (the subset of JSON Schema used by the suite).

    ``index`` (the position in the enclosing array, or the property's position) rotates ``enum`` and
    ``anyOf`` choices and varies numbers; recursive ``$ref`` stops adding array items below depth 3."""
    root = schema if root is None else root
    if "$ref" in schema:
        return make_instance(_resolve(schema["$ref"], root), root, index, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][index % len(schema["enum"])]
    if "anyOf" in schema:
        branches = schema["anyOf"]
        return make_instance(branches[index % len(branches)], root, index, depth + 1)
    if "examples" in schema:
        return schema["examples"][0]
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "null":
        return None
    if kind == "boolean":
        return index % 2 == 0
    if kind == "integer":
        lo, hi = _bounds(schema, 1)
        if lo is not None and hi is not None:
            return int(lo + (hi - lo) * (index % 5 + 1) // 6)
        if lo is not None:
            return int(lo) + 7 + index
        if hi is not None:
            return int(hi) - 7 - index
        return 42 + index
    if kind == "number":
        lo, hi = _bounds(schema, 0.01)
        if lo is not None and hi is not None:
            return round(lo + (hi - lo) * (index % 5 + 1) / 6, 2)
        if lo is not None:
            return round(lo + 3.25 + index, 2)
        if hi is not None:
            return round(hi - 3.25 - index, 2)
        return round(3.25 + 1.5 * index, 2)
    if kind == "string":
        if "format" in schema:
            return _FORMAT_VALUES[schema["format"]]
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", 10_000)
        return _text(max(lo, min(hi, 12 + 5 * (index % 4))), index + depth)
    if kind == "array":
        lo, hi = schema.get("minItems", 0), schema.get("maxItems", 10_000)
        n = max(lo, min(hi, 2 if depth < 6 else 0))
        items = schema.get("items", {})
        return [make_instance(items, root, k, depth + 1) for k in range(n)]
    if kind == "object":
        required = set(schema.get("required", ()))
        out, optional_seen = {}, 0
        for i, (key, sub) in enumerate(schema.get("properties", {}).items()):
            if key not in required:
                optional_seen += 1
                if optional_seen % 2 == 0:  # every other optional property is left out
                    continue
            out[key] = make_instance(sub, root, i, depth + 1)
        return out
    raise ValueError(f"make_instance: unsupported schema {schema!r}")


def validate_instance(schema: dict, instance) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``instance`` is valid (formats checked)."""
    import jsonschema

    cls = jsonschema.Draft202012Validator
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(instance)


def instance_text(schema: dict) -> str:
    instance = make_instance(schema)
    validate_instance(schema, instance)
    return json.dumps(instance)


