"""The structured-output schema suite: every schema compiles with llguidance on the embedded tokenizer, the
instance generator's output is valid (jsonschema) and accepted token by token by llguidance, and the
mask-cost measurements run and return positive numbers."""

from __future__ import annotations

import json

import pytest

llguidance = pytest.importorskip("llguidance")
pytest.importorskip("jsonschema")

from bench.structured import instances, mask_cost  # noqa: E402
from bench.structured.schemas import SCHEMA_BY_NAME, SCHEMAS, SIZES, by_size  # noqa: E402

NAMES = [name for name, _ in SCHEMAS]


@pytest.fixture(scope="module")
def tokenizer_json() -> str:
    return mask_cost.EMBEDDED_TOKENIZER.read_text()


@pytest.fixture(scope="module")
def llg_tokenizer(tokenizer_json):
    return llguidance.LLTokenizer(tokenizer_json, eos_token=0)


def test_suite_shape():
    assert len(SCHEMAS) >= 24
    assert len(set(NAMES)) == len(NAMES)
    assert set(SIZES) == set(NAMES)
    assert set(SIZES.values()) == {"small", "medium", "large"}
    for name in ("product_catalog", "user_profile", "service_config", "insurance_claim_form"):
        assert 30 <= len(SCHEMA_BY_NAME[name]["properties"]) <= 50, name
    assert [n for n, _ in by_size("large")] == [n for n in NAMES if SIZES[n] == "large"]


def test_suite_covers_the_keywords():
    text = json.dumps([s for _, s in SCHEMAS])
    for keyword in ('"minItems"', '"maxItems"', '"enum"', '"minimum"', '"maximum"', '"exclusiveMinimum"',
                    '"exclusiveMaximum"', '"pattern"', '"minLength"', '"maxLength"', '"anyOf"', '"const"',
                    '"boolean"', '"null"', '"additionalProperties": false', '"$defs"', '"$ref"'):
        assert keyword in text, keyword
    for fmt in ("date", "email", "uuid", "date-time"):
        assert f'"format": "{fmt}"' in text, fmt


@pytest.mark.parametrize("name", NAMES)
def test_schema_compiles_with_llguidance(name, llg_tokenizer):
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA_BY_NAME[name])
    assert llguidance.LLMatcher.validate_grammar(grammar, llg_tokenizer) == ""


@pytest.mark.parametrize("name", NAMES)
def test_instance_is_valid_and_accepted(name, tokenizer_json, llg_tokenizer):
    schema = SCHEMA_BY_NAME[name]
    instance = instances.make_instance(schema)
    instances.validate_instance(schema, instance)  # raises if invalid
    assert instances.make_instance(schema) == instance  # deterministic
    tokens = mask_cost.encode(tokenizer_json, json.dumps(instance))
    matcher = llguidance.LLMatcher(llg_tokenizer, llguidance.LLMatcher.grammar_from_json_schema(schema))
    for tok in tokens:
        assert matcher.consume_token(tok), matcher.get_error()
    assert matcher.is_accepting()


def test_long_fixed_parts_is_mostly_fixed_text():
    schema = SCHEMA_BY_NAME["long_fixed_parts"]
    instance = instances.make_instance(schema)
    text = json.dumps(instance)
    free = sum(len(json.dumps(v)) for k, v in instance.items() if "const" not in schema["properties"][k])
    assert (len(text) - free) / len(text) >= 0.5


def test_measure_llguidance_small_schema(tokenizer_json, llg_tokenizer):
    schema = SCHEMA_BY_NAME["sentiment"]
    tokens = mask_cost.encode(tokenizer_json, instances.instance_text(schema))
    out = mask_cost.measure_llguidance(llg_tokenizer, schema, tokens, repeats=1, batch=4,
                                       executor=llguidance.LLExecutor(2))
    assert out["status"] == "ok"
    assert out["grammar_from_json_schema_ms"] > 0 and out["matcher_create_ms"] > 0
    assert out["mask_us"]["n"] == len(tokens) + 1
    assert out["mask_us"]["median"] > 0 and out["mask_us"]["p99"] >= out["mask_us"]["median"]
    assert out["batch4_step_us"]["median"] > 0


def test_measure_llguidance_reports_a_rejected_instance(tokenizer_json, llg_tokenizer):
    schema = SCHEMA_BY_NAME["sentiment"]
    tokens = mask_cost.encode(tokenizer_json, '{"sentiment": "angry", "confidence": 0.5}')
    out = mask_cost.measure_llguidance(llg_tokenizer, schema, tokens, repeats=1, batch=0)
    assert out["status"] == "rejected"


def test_token_bytes_roundtrip(tokenizer_json, llg_tokenizer):
    pieces, special = mask_cost.token_bytes(tokenizer_json)
    assert special == {0}
    for i in (1, 2, 100, 1000, 4095):
        assert pieces[i] == llg_tokenizer.decode_bytes([i])


def test_measure_outlines_small_schema(tokenizer_json):
    pytest.importorskip("outlines_core")
    schema = SCHEMA_BY_NAME["sentiment"]
    tokens = mask_cost.encode(tokenizer_json, instances.instance_text(schema))
    out = mask_cost.measure_outlines(tokenizer_json, schema, tokens)
    assert out["status"] == "ok"
    assert out["index_s"] > 0 and out["mask_us"]["median"] > 0
    assert out["mask_us"]["n"] == len(tokens) + 1


def test_outlines_unsupported_format_is_recorded(tokenizer_json):
    pytest.importorskip("outlines_core")
    schema = {"type": "object", "properties": {"h": {"type": "string", "format": "hostname"}}, "required": ["h"]}
    out = mask_cost.measure_outlines(tokenizer_json, schema, mask_cost.encode(tokenizer_json, '{"h": "a.com"}'))
    assert out["status"] == "unsupported" and "hostname" in out["error"]


def test_arguments_parse():
    import argparse

    p = argparse.ArgumentParser()
    mask_cost.add_arguments(p)
    args = p.parse_args(["--output", "x.json", "--schemas", "sentiment", "--tokenizers", "embedded"])
    assert args.output == "x.json" and args.batch == 16 and args.coverage
