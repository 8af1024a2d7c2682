"""The OpenAI-compatible server, end to end: a real uvicorn server on a free port with the embedded model,
driven by the official ``openai`` client (and httpx for raw bodies), checked against ``LLM.generate`` (and
the chat prompt against transformers' ``apply_chat_template``). One server and one offline LLM per module."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import threading
import time

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from jaxinfer import LLM, SamplingParams  # noqa: E402
from jaxinfer.loading.model_source import default_model_dir  # noqa: E402
from jaxinfer.server import launch  # noqa: E402

KEY = "test-key"
ENGINE = ["--compilation", "lazy", "--max-num-seqs", "32", "--max-model-len", "256", "--seed", "0"]
PROMPTS = ["def fibonacci(n):", "import os\n", "class Parser:\n    def __init__(self", "# sort a list\n"]


def _serve_in_thread(argv: list[str]):
    """A uvicorn server (app built like `jaxinfer serve ARGV`) on a free port, in a thread."""
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    app, name = launch.build(parser.parse_args(argv))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}", app


@contextlib.contextmanager
def live_server(argv: list[str]):
    """``(url, app)`` of a server started by ``_serve_in_thread(argv)``, stopped on leaving."""
    srv, thread, url, app = _serve_in_thread(argv)
    try:
        yield url, app
    finally:
        srv.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def server():
    with live_server([*ENGINE, "--api-key", KEY]) as running:
        yield running


@pytest.fixture(scope="module")
def url(server):
    return server[0]


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def llm():
    return LLM(compilation="lazy", max_num_seqs=32, max_model_len=256, seed=0)


def _offline(llm, prompts, **kw):
    return llm.generate(prompts, SamplingParams(**kw), use_tqdm=False)


def _metrics(url) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _metric(m: dict, name: str, **labels) -> float:
    want = {"model_name": "jaxinfer-default", **labels}
    for key, v in m.items():
        base, _, rest = key.partition("{")
        if base == name and dict(kv.split("=", 1) for kv in rest.rstrip("}").replace('"', "").split(",")) == want:
            return v
    raise KeyError(name)


# ------------------------------------------------------------------------------------------- completions
def test_completions_greedy_equal_offline(client, llm):
    ref = _offline(llm, PROMPTS, temperature=0.0, max_tokens=24)
    resp = client.completions.create(model="jaxinfer-default", prompt=PROMPTS, max_tokens=24, temperature=0.0,
                                     extra_body={"return_token_ids": True})
    assert [c.index for c in resp.choices] == list(range(len(PROMPTS)))
    for choice, r in zip(resp.choices, ref):
        assert choice.text == r.outputs[0].text
        assert choice.token_ids == r.outputs[0].token_ids
        assert choice.finish_reason == r.outputs[0].finish_reason
    assert resp.usage.prompt_tokens == sum(len(r.prompt_token_ids) for r in ref)
    assert resp.usage.completion_tokens == sum(len(r.outputs[0].token_ids) for r in ref)
    # token-id prompts, echo
    ids = ref[0].prompt_token_ids
    resp = client.completions.create(model="jaxinfer-default", prompt=ids, max_tokens=24, temperature=0.0, echo=True)
    assert resp.choices[0].text == PROMPTS[0] + ref[0].outputs[0].text


def test_completions_stream_equal_offline_with_usage_last(client, llm):
    ref = _offline(llm, [PROMPTS[1]], temperature=0.0, max_tokens=32, ignore_eos=True)[0]
    chunks = list(client.completions.create(
        model="jaxinfer-default", prompt=PROMPTS[1], max_tokens=32, temperature=0.0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "return_token_ids": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    ids = [t for c in chunks if c.choices for t in c.choices[0].token_ids]
    assert len([c for c in chunks if c.choices]) > 1  # really streamed
    assert text == ref.outputs[0].text and ids == ref.outputs[0].token_ids
    last = chunks[-1]
    assert last.choices == [] and all(c.usage is None for c in chunks[:-1])
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(ref.prompt_token_ids), 32)
    assert last.usage.total_tokens == len(ref.prompt_token_ids) + 32
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_n_samples_equal_offline(client, llm):
    kw = dict(temperature=0.8, top_p=0.95, max_tokens=16, seed=7)
    ref = _offline(llm, [PROMPTS[0]], n=3, **kw)[0]
    resp = client.completions.create(model="jaxinfer-default", prompt=PROMPTS[0], n=3, **kw)
    assert sorted(c.index for c in resp.choices) == [0, 1, 2]
    assert [c.text for c in sorted(resp.choices, key=lambda c: c.index)] == [o.text for o in ref.outputs]
    streamed = {}
    for chunk in client.completions.create(model="jaxinfer-default", prompt=[PROMPTS[0], PROMPTS[2]], n=3,
                                           stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    ref2 = _offline(llm, [PROMPTS[2]], n=3, **kw)[0]
    assert streamed == {i: t for i, t in enumerate([o.text for o in ref.outputs] + [o.text for o in ref2.outputs])}


def test_stop_string_split_across_chunks(client, llm):
    full = _offline(llm, [PROMPTS[0]], temperature=0.0, max_tokens=24, ignore_eos=True)[0].outputs[0]
    tok = llm.get_tokenizer()
    # a stop string made of the end of token 6's text and the start of token 7's: never inside one chunk
    a, b = tok.decode(full.token_ids[:6]), tok.decode(full.token_ids[:7])
    stop = a[-2:] + b[len(a):len(a) + 2]
    assert len(stop) == 4 and b[len(a):].startswith(stop[2:]) and full.text.find(stop) == len(a) - 2
    ref = _offline(llm, [PROMPTS[0]], temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop])[0].outputs[0]
    assert ref.finish_reason == "stop" and ref.text == full.text[:len(a) - 2]
    chunks = list(client.completions.create(model="jaxinfer-default", prompt=PROMPTS[0], max_tokens=24,
                                            temperature=0.0, stop=[stop], stream=True,
                                            extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == "stop"
    resp = client.completions.create(model="jaxinfer-default", prompt=PROMPTS[0], max_tokens=24, temperature=0.0,
                                     stop=stop, extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert resp.choices[0].text == full.text[:len(a) + 2]


def test_logprobs_equal_offline(client, llm):
    ref = _offline(llm, [PROMPTS[3]], temperature=0.0, max_tokens=8, logprobs=2)[0].outputs[0]
    tok = llm.get_tokenizer()
    resp = client.completions.create(model="jaxinfer-default", prompt=PROMPTS[3], max_tokens=8, temperature=0.0,
                                     logprobs=2)
    lp = resp.choices[0].logprobs
    assert lp.tokens == [tok.decode([t], skip_special_tokens=False) for t in ref.token_ids]
    assert lp.token_logprobs == pytest.approx([e[t] for t, e in zip(ref.token_ids, ref.logprobs)], abs=1e-4)
    for top, entry in zip(lp.top_logprobs, ref.logprobs):
        want = {tok.decode([k], skip_special_tokens=False): v for k, v in entry.items()}
        assert top == pytest.approx(want, abs=1e-4)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    # chat: logprobs + top_logprobs, streamed
    msgs = [{"role": "user", "content": "read a file"}]
    stream = client.chat.completions.create(model="jaxinfer-default", messages=msgs, max_tokens=8,
                                            temperature=0.0, logprobs=True, top_logprobs=2, stream=True)
    content = [x for chunk in stream for c in chunk.choices if c.logprobs for x in c.logprobs.content]
    assert len(content) == 8 and all(len(x.top_logprobs) == 2 for x in content)
    # greedy: the sampled token is the most likely one
    assert all(x.top_logprobs[0].token == x.token and x.top_logprobs[0].logprob == x.logprob
               >= x.top_logprobs[1].logprob for x in content)


# ------------------------------------------------------------------------------------------------ chat
def test_chat_equal_offline_through_transformers_template(client, llm):
    transformers = pytest.importorskip("transformers")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(default_model_dir()))
    msgs = [{"role": "system", "content": "You write Python."},
            {"role": "user", "content": "A function that\nreverses a string."}]
    template = (default_model_dir() / "chat_template.jinja").read_text()  # what the server must find by itself
    prompt = hf_tok.apply_chat_template(msgs, chat_template=template, add_generation_prompt=True, tokenize=False)
    ref = _offline(llm, [prompt], temperature=0.0, max_tokens=20)[0]
    resp = client.chat.completions.create(model="jaxinfer-default", messages=msgs, max_tokens=20, temperature=0.0)
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == ref.outputs[0].text
    assert resp.usage.prompt_tokens == len(ref.prompt_token_ids)
    chunks = list(client.chat.completions.create(model="jaxinfer-default", messages=msgs, max_tokens=20,
                                                 temperature=0.0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.outputs[0].text
    assert chunks[-1].usage.completion_tokens == len(ref.outputs[0].token_ids)


# ------------------------------------------------------------------------------------------ concurrency
def _concurrent_greedy_streams(url, prompts, lens) -> list[tuple[list[int], str]]:
    """Every prompt streamed at once (greedy, ``lens`` tokens each, EOS ignored): (token ids, last finish reason)."""
    aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)

    async def one(p, n):
        ids, reasons = [], []
        async for chunk in await aclient.completions.create(
                model="jaxinfer-default", prompt=p, max_tokens=n, temperature=0.0, stream=True,
                extra_body={"ignore_eos": True, "return_token_ids": True}):
            ids.extend(chunk.choices[0].token_ids)
            reasons.append(chunk.choices[0].finish_reason)
        return ids, reasons[-1]

    async def main():
        try:
            return await asyncio.gather(*(one(p, n) for p, n in zip(prompts, lens)))
        finally:
            await aclient.close()

    return asyncio.run(main())


def test_32_concurrent_streams_equal_offline(url, llm):
    prompts = [f"def function_{i}(x):\n    " for i in range(32)]
    lens = [8 + (i * 7) % 25 for i in range(32)]
    ref = llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lens],
                       use_tqdm=False)
    got = _concurrent_greedy_streams(url, prompts, lens)
    assert [ids for ids, _ in got] == [r.outputs[0].token_ids for r in ref]


def test_disconnect_mid_stream_frees_blocks(url):
    before = _metrics(url)
    body = {"prompt": PROMPTS[0], "max_tokens": 200, "temperature": 0.0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as r:
        lines = r.iter_lines()
        assert [next(lines) for _ in range(6)][0].startswith("data: ")  # a few tokens arrived, then hang up
    for _ in range(400):
        m = _metrics(url)
        if _metric(m, "jaxinfer:request_success_total", finished_reason="abort") > \
                _metric(before, "jaxinfer:request_success_total", finished_reason="abort") and \
                _metric(m, "jaxinfer:num_requests_running") == 0:
            break
        time.sleep(0.05)
    assert _metric(m, "jaxinfer:num_requests_running") == 0
    assert _metric(m, "jaxinfer:kv_cache_usage_perc") == 0.0
    generated = _metric(m, "jaxinfer:generation_tokens_total") - _metric(before, "jaxinfer:generation_tokens_total")
    assert 3 <= generated < 200  # aborted, not run to its end


def test_disconnect_before_a_non_streamed_answer_aborts(url):
    before = _metrics(url)
    payload = json.dumps({"prompt": PROMPTS[1], "max_tokens": 240, "temperature": 0.0, "ignore_eos": True}).encode()
    host, port = url.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                 b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
    for _ in range(3000):  # it runs (240 steps to go) ...
        if _metric(_metrics(url), "jaxinfer:num_requests_running") >= 1:
            break
        time.sleep(0.01)
    sock.close()  # ... when the client goes away without reading the answer
    for _ in range(400):
        m = _metrics(url)
        if _metric(m, "jaxinfer:request_success_total", finished_reason="abort") > \
                _metric(before, "jaxinfer:request_success_total", finished_reason="abort"):
            break
        time.sleep(0.05)
    assert _metric(m, "jaxinfer:request_success_total", finished_reason="length") == \
        _metric(before, "jaxinfer:request_success_total", finished_reason="length")
    assert _metric(m, "jaxinfer:num_requests_running") == 0 and _metric(m, "jaxinfer:kv_cache_usage_perc") == 0.0


# --------------------------------------------------------------------------------------------- bad input
BAD = [
    ("malformed JSON", b'{"prompt": "x", ', 400, "not valid JSON"),
    ("not an object", b"[1, 2]", 400, "JSON object"),
    ("wrong type", {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ("wrong prompt type", {"prompt": 12}, 400, "prompt"),
    ("unknown field", {"prompt": "x", "logit_bias": {"1": 2}}, 400, "logit_bias"),
    ("unknown model", {"prompt": "x", "model": "gpt-4"}, 404, "gpt-4"),
    ("negative max_tokens", {"prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    ("min_tokens beyond the context", {"prompt": "x", "max_tokens": 10 ** 6, "min_tokens": 10 ** 6}, 400,
     "min_tokens"),
    ("n = 0", {"prompt": "x", "n": 0}, 400, "n must be"),
    ("prompt too long", {"prompt": list(range(1, 300))}, 400, "max_model_len"),
    ("token id out of range", {"prompt": [1, 99999]}, 400, "out of range"),
    ("bad logprobs", {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ("bad temperature", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("empty messages", {"messages": []}, 400, "messages"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "wizard"),
    ("chat bad top_logprobs", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                               "top_logprobs": 50}, 400, "logprobs"),
    ("chat top_logprobs without logprobs", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
     400, "logprobs"),
    ("chat missing messages", {"model": "jaxinfer-default"}, 400, "messages"),
]


@pytest.mark.parametrize("name,body,status,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_4xx_and_next_request_served(url, client, llm, name, body, status, needle):
    route = "/v1/chat/completions" if (isinstance(body, dict) and ("messages" in body or "chat" in name)) \
        else "/v1/completions"
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(url + route, headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
                   timeout=60, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"]
    ok = client.completions.create(model="jaxinfer-default", prompt=PROMPTS[0], max_tokens=6, temperature=0.0)
    assert ok.choices[0].text == _offline(llm, [PROMPTS[0]], temperature=0.0, max_tokens=6)[0].outputs[0].text


def test_max_tokens_beyond_the_context_is_capped_as_vllm_does(client, llm):
    """vLLM lowers a max_tokens the context cannot hold to what is left after the prompt (``vllm bench serve``'s
    random prompts rely on it); the answer ends with finish_reason "length" at max_model_len."""
    prompt_len = len(_offline(llm, [PROMPTS[1]], max_tokens=1)[0].prompt_token_ids)
    room = 256 - prompt_len  # the server's max_model_len
    ref = _offline(llm, [PROMPTS[1]], temperature=0.0, max_tokens=room, ignore_eos=True)[0].outputs[0]
    for max_tokens in (room + 1, 10 ** 6):
        resp = client.completions.create(model="jaxinfer-default", prompt=PROMPTS[1], max_tokens=max_tokens,
                                         temperature=0.0, extra_body={"ignore_eos": True})
        assert resp.usage.completion_tokens == room and resp.choices[0].finish_reason == "length"
        assert resp.choices[0].text == ref.text


def test_openai_client_sees_typed_errors(url, client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="n must be"):
        client.completions.create(model="jaxinfer-default", prompt="x", n=0)
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="jaxinfer-default", prompt="x", max_tokens=2)
    assert httpx.post(url + "/v1/completions", json={"prompt": "x"}).status_code == 401  # no header at all


# ------------------------------------------------------------------------------------------ other routes
def test_models_tokenize_detokenize_health_version(url, client, llm):
    models = client.models.list()
    assert [m.id for m in models.data] == ["jaxinfer-default"]
    headers = {"Authorization": f"Bearer {KEY}"}
    tok = llm.get_tokenizer()
    r = httpx.post(url + "/tokenize", json={"prompt": PROMPTS[2]}, headers=headers).json()
    assert r["tokens"] == tok.encode(PROMPTS[2]) and r["count"] == len(r["tokens"]) and r["max_model_len"] == 256
    r2 = httpx.post(url + "/detokenize", json={"tokens": r["tokens"]}, headers=headers).json()
    assert r2["prompt"] == tok.decode(r["tokens"])
    chat = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}, headers=headers)
    assert chat.json()["tokens"] == tok.encode("# hi\n", add_special_tokens=False)
    assert httpx.post(url + "/detokenize", json={"tokens": [10 ** 6]}, headers=headers).status_code == 400
    assert httpx.get(url + "/health").status_code == 200
    assert "version" in httpx.get(url + "/version").json()


def test_metrics_count_requests_and_tokens(url, client):
    before = _metrics(url)
    resp = client.completions.create(model="jaxinfer-default", prompt=PROMPTS[1], max_tokens=5, temperature=0.0,
                                     extra_body={"ignore_eos": True})
    m = _metrics(url)
    assert resp.usage.completion_tokens == 5

    def delta(name, **labels):
        return _metric(m, name, **labels) - _metric(before, name, **labels)

    assert delta("jaxinfer:generation_tokens_total") == 5
    assert delta("jaxinfer:prompt_tokens_total") == resp.usage.prompt_tokens
    assert delta("jaxinfer:request_success_total", finished_reason="length") == 1
    assert delta("jaxinfer:time_to_first_token_seconds_count") == 1
    assert delta("jaxinfer:inter_token_latency_seconds_count") == 4
    assert delta("jaxinfer:e2e_request_latency_seconds_count") == 1
    assert delta("jaxinfer:prefix_cache_queries_total") == resp.usage.prompt_tokens
    for name in ("jaxinfer:num_requests_waiting", "jaxinfer:num_preemptions_total",
                 "jaxinfer:spec_decode_num_draft_tokens_total", "jaxinfer:spec_decode_num_accepted_tokens_total",
                 "jaxinfer:num_compilations_total", "jaxinfer:prefix_cache_hits_total"):
        _metric(m, name)  # exported
    assert json.dumps(m)  # parseable exposition format


# ----------------------------------------------------------------------------------------- the HTTP bench
def test_http_serving_bench_against_the_server(url, tmp_path):
    """``jaxinfer-bench serve --url``: the Poisson workload through streaming HTTP, timed on the client."""
    from bench import cli as bench_cli

    out = tmp_path / "http.json"
    assert bench_cli.main(["serve", "--url", url, "--api-key", KEY, "--num-requests", "6", "--passes", "1",
                           "--rate", "20", "--input-len", "12", "--output-len", "5", "--output", str(out)]) == 0
    run = json.loads(out.read_text())["runs"]["http"]
    assert run["num_requests"] == 6 and run["total_output_tokens"] == 30
    assert all(r["output_len"] == 5 and r["num_chunks"] == 5 for r in run["requests"])
    assert 0 < run["ttft_s"]["p50"] <= run["e2e_s"]["p50"]


def test_explicit_nulls_mean_defaults(url, llm):
    body = {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0.0, "n": None, "top_p": None, "top_k": None,
            "seed": None, "stop": None, "stream": None, "logprobs": None, "presence_penalty": None}
    r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == _offline(llm, [PROMPTS[0]], temperature=0.0, max_tokens=6)[0] \
        .outputs[0].text


def test_multi_step_server_streams_the_tokens_of_single_steps(llm):
    """`jaxinfer serve --num-scheduler-steps 4`: bursts of decode steps; streamed tokens, stop strings and
    finish reasons equal the single-step offline engine's."""
    srv, thread, url, _ = _serve_in_thread([*ENGINE, "--api-key", KEY, "--num-scheduler-steps", "4"])
    try:
        prompts = [f"def function_{i}(x):\n    " for i in range(6)]
        lens = [3, 9, 14, 1, 22, 7]
        ref = llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lens],
                           use_tqdm=False)
        got = _concurrent_greedy_streams(url, prompts, lens)
        assert [ids for ids, _ in got] == [r.outputs[0].token_ids for r in ref]
        assert all(reason == "length" for _, reason in got)
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        full = _offline(llm, [PROMPTS[0]], temperature=0.0, max_tokens=24, ignore_eos=True)[0].outputs[0].text
        stop = full[len(full) // 2: len(full) // 2 + 3]  # a stop string inside a burst
        want = _offline(llm, [PROMPTS[0]], temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop])[0]
        out = client.completions.create(model="jaxinfer-default", prompt=PROMPTS[0], max_tokens=24,
                                        temperature=0.0, stop=[stop], extra_body={"ignore_eos": True})
        assert out.choices[0].text == want.outputs[0].text and out.choices[0].finish_reason == "stop"
    finally:
        srv.should_exit = True
        thread.join(30)
