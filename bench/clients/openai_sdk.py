"""The official ``openai`` Python SDK against the server: each check calls the SDK as an application would and
asserts what OpenAI's API (and vLLM's extensions the SDK passes through) promises.

Checks: ``completions``, ``chat``, ``responses`` and ``responses stream`` (``client.responses.create``),
``stream completions`` and ``stream chat`` with ``stream_options={"include_usage": True,
"continuous_usage_stats": True}`` (the usage so far on every chunk, the total on a last chunk without
choices), ``n`` (several choices per request, completions and chat), ``logprobs`` (completions' top-k
logprobs and chat's ``top_logprobs``), and ``prompt logprobs`` (``echo`` with ``logprobs``: the prompt scored,
what lm-eval's loglikelihood requests send). A check returns its key numbers or raises (an
``AssertionError`` saying what was wrong, or the SDK's own error: ``openai.NotFoundError: Error code:
404 ...`` where a route is missing). ``run_all`` turns them into ``ClientResult`` rows; the tests
(``tests/server/test_clients.py``) call the same functions one by one.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

from bench.clients.common import FAILED, OK, ClientResult, clip, first_error_line, package_version

PROMPT = "def fibonacci(n):"
CODE = "def add(a, b):\n    return a + b\n"
MESSAGES = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
MAX_TOKENS = 16
IGNORE_EOS = {"ignore_eos": True}  # vLLM's extension (jaxinfer honours it): every choice is MAX_TOKENS long
CONTINUOUS_USAGE = {"include_usage": True, "continuous_usage_stats": True}

# check name -> the server feature it waits for (being built at the time of writing; remove it once it lands)
PENDING: dict[str, str] = {}  # check -> the server feature it waits for (none today)


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    command: str  # the SDK call, as an application writes it
    fn: Callable  # fn(client, model) -> dict of key numbers; raises on a wrong answer


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


# ------------------------------------------------------------------------------------------------- checks
def check_completions(client, model: str) -> dict:
    t0 = time.perf_counter()
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0)
    ms = _ms(t0)
    assert resp.object == "text_completion", resp.object
    assert len(resp.choices) == 1 and resp.choices[0].index == 0
    choice = resp.choices[0]
    assert isinstance(choice.text, str) and choice.finish_reason in ("length", "stop"), choice
    assert 0 < resp.usage.completion_tokens <= MAX_TOKENS, resp.usage
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens, resp.usage
    again = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0)
    assert again.choices[0].text == choice.text, "greedy decoding gave two different texts"
    return {"latency_ms": ms, "prompt_tokens": resp.usage.prompt_tokens,
            "completion_tokens": resp.usage.completion_tokens}


def check_chat(client, model: str) -> dict:
    t0 = time.perf_counter()
    resp = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0.0)
    ms = _ms(t0)
    assert resp.object == "chat.completion", resp.object
    msg = resp.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str), msg
    assert resp.choices[0].finish_reason in ("length", "stop"), resp.choices[0]
    assert 0 < resp.usage.completion_tokens <= MAX_TOKENS, resp.usage
    return {"latency_ms": ms, "prompt_tokens": resp.usage.prompt_tokens,
            "completion_tokens": resp.usage.completion_tokens}


def check_responses(client, model: str) -> dict:
    t0 = time.perf_counter()
    resp = client.responses.create(model=model, input="Write a Python function that adds two numbers.",
                                   max_output_tokens=MAX_TOKENS, temperature=0.0)
    ms = _ms(t0)
    assert resp.object == "response", resp.object
    assert resp.status in ("completed", "incomplete"), resp.status
    assert resp.output and resp.output[0].type == "message" and resp.output[0].role == "assistant", resp.output
    text = resp.output_text
    assert isinstance(text, str), text
    assert 0 < resp.usage.output_tokens <= MAX_TOKENS, resp.usage
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens, resp.usage
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0.0)
    assert text == chat.choices[0].message.content, (text, chat.choices[0].message.content)
    return {"latency_ms": ms, "input_tokens": resp.usage.input_tokens, "output_tokens": resp.usage.output_tokens}


def check_responses_stream(client, model: str) -> dict:
    t0 = time.perf_counter()
    events = list(client.responses.create(model=model, input="Write a Python function that adds two numbers.",
                                          max_output_tokens=MAX_TOKENS, temperature=0.0, stream=True))
    ms = _ms(t0)
    types = [e.type for e in events]
    assert types[0] == "response.created", types[:3]
    assert types[-1] in ("response.completed", "response.incomplete"), types[-3:]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text, (deltas, final.output_text)
    assert 0 < final.usage.output_tokens <= MAX_TOKENS, final.usage
    return {"latency_ms": ms, "events": len(events), "output_tokens": final.usage.output_tokens}


def _check_usage_on_every_chunk(chunks: list, text_of) -> dict:
    """Every chunk with choices carries the usage so far (prompt fixed, completion non-decreasing); the last
    chunk has no choices and the total; the completion tokens are exactly MAX_TOKENS (ignore_eos)."""
    assert chunks, "no chunks"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None, f"the last chunk is not the usage chunk: {last}"
    with_choices = [c for c in chunks if c.choices]
    assert len(with_choices) > 1, "not streamed"
    missing = [i for i, c in enumerate(with_choices) if c.usage is None]
    assert not missing, (f"{len(missing)} of {len(with_choices)} chunks with choices have no usage "
                         "(stream_options.continuous_usage_stats asks for it on every chunk)")
    seen = [c.usage.completion_tokens for c in with_choices]
    assert seen == sorted(seen), f"completion_tokens went down across chunks: {seen}"
    assert all(c.usage.prompt_tokens == last.usage.prompt_tokens for c in with_choices)
    assert seen[-1] == last.usage.completion_tokens == MAX_TOKENS, (seen[-1], last.usage)
    for c in with_choices:
        assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens, c.usage
    return {"chunks": len(chunks), "completion_tokens": last.usage.completion_tokens,
            "text": "".join(text_of(c) for c in with_choices)}


def check_stream_completions(client, model: str) -> dict:
    t0 = time.perf_counter()
    first_ms, chunks = None, []
    for chunk in client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0,
                                           stream=True, stream_options=CONTINUOUS_USAGE, extra_body=IGNORE_EOS):
        if first_ms is None and chunk.choices:
            first_ms = _ms(t0)
        chunks.append(chunk)
    got = _check_usage_on_every_chunk(chunks, lambda c: c.choices[0].text)
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0,
                                      extra_body=IGNORE_EOS)
    assert got.pop("text") == whole.choices[0].text, "the streamed text differs from the non-streamed one"
    return {"ttft_ms": first_ms, **got}


def check_stream_chat(client, model: str) -> dict:
    t0 = time.perf_counter()
    first_ms, chunks = None, []
    for chunk in client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                temperature=0.0, stream=True, stream_options=CONTINUOUS_USAGE,
                                                extra_body=IGNORE_EOS):
        if first_ms is None and chunk.choices and chunk.choices[0].delta.content:
            first_ms = _ms(t0)
        chunks.append(chunk)
    got = _check_usage_on_every_chunk(chunks, lambda c: c.choices[0].delta.content or "")
    whole = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0.0,
                                           extra_body=IGNORE_EOS)
    assert got.pop("text") == whole.choices[0].message.content, "the streamed text differs from the non-streamed one"
    return {"ttft_ms": first_ms, **got}


def check_n(client, model: str) -> dict:
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=0, n=3,
                                     extra_body=IGNORE_EOS)
    assert sorted(c.index for c in resp.choices) == [0, 1, 2], [c.index for c in resp.choices]
    assert resp.usage.completion_tokens == 3 * 8, resp.usage
    two = client.completions.create(model=model, prompt=[PROMPT, CODE], max_tokens=4, temperature=0.0, n=2,
                                    extra_body=IGNORE_EOS)
    assert sorted(c.index for c in two.choices) == [0, 1, 2, 3], "2 prompts x n=2 are choices 0..3"
    assert two.choices[0].text == two.choices[1].text, "greedy choices of one prompt differ"
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=0,
                                          n=2, extra_body=IGNORE_EOS)
    assert sorted(c.index for c in chat.choices) == [0, 1] and chat.usage.completion_tokens == 2 * 8, chat.usage
    return {"choices": len(resp.choices) + len(two.choices) + len(chat.choices),
            "distinct_sampled": len({c.text for c in resp.choices})}


def check_logprobs(client, model: str) -> dict:
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0.0, logprobs=3,
                                     extra_body=IGNORE_EOS)
    lp = resp.choices[0].logprobs
    assert lp is not None, "no logprobs"
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8, lp
    assert "".join(lp.tokens) == resp.choices[0].text, (lp.tokens, resp.choices[0].text)
    assert lp.text_offset == sorted(lp.text_offset)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and math.isfinite(value), value
        assert 3 <= len(top) <= 4, top  # the top 3, plus the sampled token when it is not among them
        assert math.isclose(value, max(top.values()), abs_tol=1e-4), (token, value, top)  # greedy
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=0.0,
                                          logprobs=True, top_logprobs=3, extra_body=IGNORE_EOS)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens == 8, (len(content), chat.usage)
    for entry in content:
        assert len(entry.top_logprobs) == 3, entry
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-4), entry
        assert bytes(entry.bytes) == entry.token.encode("utf-8"), entry
    assert "".join(e.token for e in content) == chat.choices[0].message.content
    return {"mean_logprob": sum(lp.token_logprobs) / len(lp.token_logprobs), "tokens": len(lp.tokens) + len(content)}


def check_prompt_logprobs(client, model: str) -> dict:
    """lm-eval's loglikelihood request (``echo``, ``logprobs=1``, ``max_tokens=1``) and the ``max_tokens=0``
    form: the prompt comes back with one logprob per token, none (null) for the first."""
    resp = client.completions.create(model=model, prompt=CODE, echo=True, logprobs=1, max_tokens=1, temperature=0.0)
    n_prompt = resp.usage.prompt_tokens
    choice = resp.choices[0]
    assert choice.text.startswith(CODE), choice.text
    lp = choice.logprobs
    assert len(lp.token_logprobs) == n_prompt + 1, (len(lp.token_logprobs), n_prompt)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, (lp.token_logprobs[0], lp.top_logprobs[0])
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:]), lp.token_logprobs
    assert "".join(lp.tokens[:n_prompt]) == CODE, lp.tokens
    zero = client.completions.create(model=model, prompt=CODE, echo=True, logprobs=1, max_tokens=0, temperature=0.0)
    assert zero.choices[0].text == CODE and zero.usage.completion_tokens == 0, (zero.choices[0].text, zero.usage)
    assert zero.choices[0].logprobs.token_logprobs == lp.token_logprobs[:n_prompt], "max_tokens 0 and 1 score apart"
    return {"prompt_tokens": n_prompt, "prompt_logprob": sum(lp.token_logprobs[1:n_prompt])}


CHECKS = [
    Check("completions", "client.completions.create(model=M, prompt=P, max_tokens=16, temperature=0)",
          check_completions),
    Check("chat", "client.chat.completions.create(model=M, messages=[...], max_tokens=16, temperature=0)",
          check_chat),
    Check("responses", "client.responses.create(model=M, input=P, max_output_tokens=16, temperature=0)",
          check_responses),
    Check("responses stream", "client.responses.create(model=M, input=P, max_output_tokens=16, stream=True)",
          check_responses_stream),
    Check("stream completions", "client.completions.create(..., stream=True, stream_options={'include_usage': "
          "True, 'continuous_usage_stats': True})", check_stream_completions),
    Check("stream chat", "client.chat.completions.create(..., stream=True, stream_options={'include_usage': True, "
          "'continuous_usage_stats': True})", check_stream_chat),
    Check("n", "client.completions.create(..., n=3, seed=0); chat n=2", check_n),
    Check("logprobs", "client.completions.create(..., logprobs=3); chat logprobs=True, top_logprobs=3",
          check_logprobs),
    Check("prompt logprobs", "client.completions.create(prompt=P, echo=True, logprobs=1, max_tokens=1 | 0)",
          check_prompt_logprobs),
]


def make_client(base_url: str, api_key: str | None = None):
    import openai

    return openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key or "none", max_retries=0,
                         timeout=300)


def run_check(check: Check, client, model: str, version: str | None) -> ClientResult:
    row = ClientResult("openai", check.name, version, check.command, pending=PENDING.get(check.name))
    t0 = time.monotonic()
    try:
        row.numbers = check.fn(client, model)
    except AssertionError as exc:
        row.result, row.error = FAILED, "AssertionError: " + first_error_line(str(exc) or "(no message)")
    except Exception as exc:  # noqa: BLE001 - the SDK's errors are the result
        message = (str(exc).strip().splitlines() or [""])[0]
        row.result, row.error = FAILED, clip(f"{type(exc).__module__.split('.')[0]}.{type(exc).__name__}: {message}")
    else:
        row.result = OK
    row.seconds = time.monotonic() - t0
    return row


def run_all(base_url: str, model: str, api_key: str | None = None) -> list[ClientResult]:
    version = package_version("openai")
    if version is None:
        return [ClientResult("openai", "all", None, "pip install openai", result="skipped",
                             error="the openai package is not installed")]
    client = make_client(base_url, api_key)
    return [run_check(c, client, model, version) for c in CHECKS]
