"""Validity of structured outputs through the server: every schema of ``bench.structured.schemas`` as a chat
request with ``response_format={"type": "json_schema", ...}`` (the openai SDK, unmodified), at each
temperature, one request at a time (batch 1) and 16 in flight (batch 16). Each output is parsed and validated
with ``jsonschema`` (formats checked); an output cut by ``max_tokens`` (``finish_reason: "length"``) is counted
apart: the engine only promises that what finished is valid."""

from __future__ import annotations

import concurrent.futures
import json
import time

from bench.structured.schemas import SCHEMAS, SIZES


def _request(client, model: str, name: str, schema: dict, temperature: float, seed: int, max_tokens: int) -> dict:
    import jsonschema

    t0 = time.perf_counter()
    r = client.chat.completions.create(
        model=model, temperature=temperature, seed=seed, max_tokens=max_tokens,
        messages=[{"role": "user", "content": f"Write one {name.replace('_', ' ')} record as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}})
    choice = r.choices[0]
    row = {"schema": name, "size": SIZES[name], "finish_reason": choice.finish_reason,
           "completion_tokens": r.usage.completion_tokens, "seconds": round(time.perf_counter() - t0, 3)}
    try:
        jsonschema.validate(json.loads(choice.message.content), schema,
                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        row["valid"] = True
    except (ValueError, jsonschema.ValidationError) as exc:
        row["valid"], row["error"] = False, str(exc).splitlines()[0][:160]
    return row


def run_validity(client, model: str, temperatures=(0.0, 1.0), batches=(1, 16), max_tokens: int = 700,
                 schemas=SCHEMAS) -> list[dict]:
    """One summary per (temperature, batch): requests, finished (stop), valid among the finished, cut by length."""
    out = []
    for temperature in temperatures:
        for batch in batches:
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(batch) as pool:
                rows = list(pool.map(lambda item: _request(client, model, item[1][0], item[1][1], temperature,
                                                           item[0], max_tokens), enumerate(schemas)))
            finished = [r for r in rows if r["finish_reason"] == "stop"]
            out.append({"temperature": temperature, "batch": batch, "requests": len(rows),
                        "finished": len(finished), "valid_of_finished": sum(r["valid"] for r in finished),
                        "cut_by_length": sum(r["finish_reason"] == "length" for r in rows),
                        "valid_of_all": sum(r["valid"] for r in rows),
                        "seconds": round(time.perf_counter() - t0, 2), "rows": rows})
    return out
