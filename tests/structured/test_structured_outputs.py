"""Structured outputs in the engine (embedded default model, its tokenizer): every finished output obeys its
constraint (JSON schemas checked with ``jsonschema``, regexes with ``re.fullmatch``, choices by membership),
invalid constraints are refused before anything is queued, constrained and free requests share steps without
changing the free ones' tokens, and nothing compiles after start."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from jaxinfer import LLM, SamplingParams, StructuredOutputsParams

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 16},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
CHOICES = ("positive", "negative", "neutral")
PROMPTS = ["User: describe a person as JSON.\nAssistant:", "The weather today is", "def add(a, b):",
           "Once upon a time"]


@pytest.fixture(scope="module")
def llm():
    """One engine, compiled at start (the masked token choosers included)."""
    return LLM(max_num_seqs=8, max_model_len=512, max_num_batched_tokens=256)


def _text(llm, prompts, params):
    return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_validate(llm, temperature):
    so = StructuredOutputsParams(json=PERSON)
    outs = _text(llm, PROMPTS, SamplingParams(temperature=temperature, max_tokens=200, seed=3, structured_outputs=so))
    for out in outs:
        assert out.finish_reason == "stop", out
        jsonschema.validate(json.loads(out.text), PERSON)
    assert llm.llm_engine.stats()["num_compilations_after_start"] == 0


def test_schema_given_as_text_and_json_object(llm):
    outs = _text(llm, PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=200,
                                                   structured_outputs=StructuredOutputsParams(json=json.dumps(PERSON))))
    for out in outs:
        jsonschema.validate(json.loads(out.text), PERSON)
    # any JSON object: may not finish in a short budget, but what finished parses as an object
    outs = _text(llm, PROMPTS, SamplingParams(temperature=0.0, max_tokens=120, seed=1,
                                              structured_outputs=StructuredOutputsParams(json_object=True)))
    for out in outs:
        assert out.text.startswith("{")
        if out.finish_reason == "stop":
            assert isinstance(json.loads(out.text), dict)
        else:
            assert out.finish_reason == "length" and len(out.token_ids) == 120


def test_choice_regex_and_grammars(llm):
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, max_tokens=20, seed=5,
                                structured_outputs=StructuredOutputsParams(choice=list(CHOICES)))
        assert all(o.text in CHOICES and o.finish_reason == "stop" for o in _text(llm, PROMPTS, params))
        regex = r"[0-9]{3}-[a-z]{2,5}"
        params = SamplingParams(temperature=temperature, max_tokens=20, seed=5,
                                structured_outputs=StructuredOutputsParams(regex=regex))
        assert all(re.fullmatch(regex, o.text) for o in _text(llm, PROMPTS, params))
    lark = 'start: "x=" NUM ("," NUM)*\nNUM: /[1-9][0-9]?/'
    gbnf = 'root ::= "x=" num ("," num)*\nnum ::= [1-9] [0-9]?'
    for grammar in (lark, gbnf):
        params = SamplingParams(temperature=1.0, max_tokens=30, seed=2,
                                structured_outputs=StructuredOutputsParams(grammar=grammar))
        for o in _text(llm, PROMPTS, params):
            if o.finish_reason == "stop":
                assert re.fullmatch(r"x=[1-9][0-9]?(,[1-9][0-9]?)*", o.text), o.text
            else:  # cut by max_tokens: a prefix of a sentence of the grammar
                assert o.finish_reason == "length" and re.fullmatch(r"x=([1-9][0-9]?,?)*", o.text), o.text


def test_length_cuts_a_constraint(llm):
    """max_tokens reached first: finish_reason "length", the text a prefix of a valid output."""
    out = _text(llm, PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=3,
                                                  structured_outputs=StructuredOutputsParams(json=PERSON)))[0]
    assert out.finish_reason == "length" and out.text.startswith("{")


def test_constrained_beside_free_requests(llm):
    """A constrained request in the same steps does not change the free requests' tokens; n > 1 gives every
    sample its own matcher."""
    free = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    alone = [o.token_ids for o in _text(llm, PROMPTS, free)]
    constrained = SamplingParams(temperature=1.0, n=3, max_tokens=200, seed=9,
                                 structured_outputs=StructuredOutputsParams(json=PERSON))
    mixed = llm.generate(PROMPTS + PROMPTS[:2], [free] * 4 + [constrained] * 2, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:4]] == alone
    for request in mixed[4:]:
        assert len(request.outputs) == 3
        for sample in request.outputs:
            jsonschema.validate(json.loads(sample.text), PERSON)
    assert llm.llm_engine.stats()["num_compilations_after_start"] == 0


def test_logprobs_see_the_constrained_distribution(llm):
    """Under a choice, every returned top logprob is a token the grammar allowed (no -inf entries), and the
    chosen token's logprob is that of the masked distribution (<= 0, finite)."""
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=5,
                            structured_outputs=StructuredOutputsParams(choice=["alpha", "beta"]))
    out = _text(llm, PROMPTS[:1], params)[0]
    tok = llm.get_tokenizer()
    for token_id, entry in zip(out.token_ids, out.logprobs):
        assert all(v > float("-inf") for v in entry.values())
        assert entry[token_id] <= 0.0
    first = out.logprobs[0]
    # the first token must begin "alpha" or "beta": each candidate's text is a prefix of one of them
    for token_id in first:
        piece = tok.decode([token_id])
        assert "alpha".startswith(piece) or "beta".startswith(piece), piece


@pytest.mark.parametrize("so, needle", [
    (dict(regex="a(b"), "regex"),
    (dict(json={"type": "nonsense"}), "json"),
    (dict(json="{not json"), "not valid JSON"),
    (dict(grammar="start: undefined_rule"), "grammar"),
])
def test_invalid_constraints_are_refused_before_queueing(llm, so, needle):
    with pytest.raises(ValueError, match=needle):
        llm.generate(PROMPTS, SamplingParams(structured_outputs=StructuredOutputsParams(**so)), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_params_validation():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(ValueError, match="choice"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(ignore_eos=True, structured_outputs=StructuredOutputsParams(regex="a+"))
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=2, structured_outputs=StructuredOutputsParams(regex="a+"))
    with pytest.raises(ValueError, match="StructuredOutputsParams"):
        SamplingParams(structured_outputs={"json": {}})
    assert StructuredOutputsParams(choice=["a", "b"]).kind == "choice"


def test_disabled_backend_refuses_with_the_reason():
    llm = LLM(compilation="lazy", max_num_seqs=2, max_model_len=128, structured_outputs_config={"backend": "disabled"})
    with pytest.raises(ValueError, match="disabled"):
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+")), use_tqdm=False)
    with pytest.raises(ValueError, match="unknown key"):
        LLM(structured_outputs_config={"bogus": 1})
