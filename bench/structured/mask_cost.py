"""Per-token grammar mask cost of two structured-output backends, llguidance and outlines-core, on this CPU.

What is measured, for every schema of ``bench.structured.schemas`` and each tokenizer (the embedded
4,096-token one and a ~150,000-token byte-level BPE trained by ``bench.structured.tokenizers``):

1. an instance: ``make_instance`` walks the schema deterministically (first/rotating ``enum`` and ``anyOf``
   choices, values inside the bounds, ``examples[0]`` for ``pattern`` strings, fixed values for formats,
   every other optional property), checks it with ``jsonschema`` (draft 2020-12, formats checked), and
   ``json.dumps`` it (separators ``", "`` and ``": "``, which both backends' default whitespace rules
   accept); the HF ``tokenizers`` library tokenizes that text. Those are the tokens replayed below, as if a
   model had sampled them.
2. llguidance (``LLMatcher``): ``grammar_from_json_schema`` time, ``LLMatcher`` creation time (it compiles
   the grammar for the tokenizer; timed twice, the second is a warm creation), then the replay: before every
   token (and once more at the end, where only EOS may follow) ``llguidance.numpy.fill_next_token_bitmask``
   fills a one-row bitmask (timed), the sampled token is checked to be allowed in it, and ``consume_token``
   (timed) advances the matcher. The replay runs ``--repeats`` times on fresh matchers; the per-token times
   of all repeats are pooled. Then a batch: ``--batch`` (16) matchers replay the same tokens in lock step and
   every step ``fill_next_token_bitmask_par`` computes the 16 rows at once on an ``LLExecutor`` with
   ``--threads`` threads (timed: that is the per-step cost a batched engine pays).
3. outlines-core (``Vocabulary``, ``json_schema.build_regex_from_schema``, ``Index``, ``Guide``), in a
   subprocess per schema limited to ``--outlines-timeout`` seconds (index construction can take minutes):
   regex build time, vocabulary build time, index construction time (its main cost: the regex DFA crossed
   with the whole vocabulary, ahead of time), guide creation, then the same replay with
   ``Guide.write_mask_into`` (timed) and ``Guide.advance``. A schema whose regex cannot be built is
   recorded as ``unsupported`` (with the error), a build over the limit as ``timeout``, an instance the
   regex rejects as ``rejected``. On the 150k tokenizer only ``--outlines-large-vocab-schemas`` are built
   (by default two small, two medium and one large schema: building all 26 would take far longer than the
   10 minutes this run is sized for); the others are recorded as ``not_run``.
4. keyword coverage (``COVERAGE_PROBES``): for each probed keyword, a schema using it is put as the value of
   a required property of an object, and one valid and one invalid document are replayed through each
   backend on the embedded tokenizer; a backend "enforces" the keyword when it accepts the valid document and
   rejects the invalid one (``ignored``: accepts both; ``rejects_valid``: refuses the valid one). This shows
   what a regex translation silently drops.

Numbers: microseconds per token, median and p99 (and mean, max, first), per schema and pooled per
(tokenizer, size, backend). Each backend's defaults are kept: llguidance allows flexible whitespace between
JSON tokens (``[ \\t\\n\\r]+``), outlines-core ``[ ]?``. Timings come from ``time.perf_counter_ns`` around
single calls, so they include the Python call overhead (~0.1-0.3 us). The machine may be shared; see
``machine`` in the JSON.

``add_arguments(parser)`` / ``run(args)`` follow the ``jaxinfer-bench`` subcommand convention;
``python -m bench.structured.mask_cost --output PATH`` runs it standalone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.structured.instances import instance_text
from bench.structured.schemas import SCHEMAS, SIZES

EMBEDDED_TOKENIZER = Path(__file__).resolve().parents[2] / "jaxinfer" / "embedded_models" / "default" / "tokenizer.json"
DEFAULT_TOKENIZER_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jaxinfer" / \
    "bench-structured" / "bpe-150k.json"
DEFAULT_OUTLINES_LARGE_VOCAB = ("sentiment", "flat_person", "tool_call", "nested_address", "service_config")
EOS_ID = 0  # <|endoftext|> in both tokenizers

# --------------------------------------------------------------------------------------- the instances

def encode(tokenizer_json: str, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json).encode(text, add_special_tokens=False).ids


# ------------------------------------------------------------------------------------------ statistics


def summarize(samples_ns) -> dict:
    """Median, p99, mean, max and first of per-call times, in microseconds."""
    a = np.asarray(samples_ns, dtype=np.float64) / 1e3
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "median": float(np.median(a)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean()), "max": float(a.max()), "first": float(a[0])}


def _allowed(mask_row: np.ndarray, token: int) -> bool:
    return bool((int(mask_row[token // 32]) >> (token % 32)) & 1)


# ----------------------------------------------------------------------------------------- llguidance


def llguidance_tokenizer(tokenizer_json: str):
    import llguidance

    start = time.perf_counter()
    tok = llguidance.LLTokenizer(tokenizer_json, eos_token=EOS_ID)
    return tok, (time.perf_counter() - start) * 1e3


def measure_llguidance(llg_tokenizer, schema: dict, tokens: list[int], repeats: int = 3, batch: int = 16,
                       executor=None) -> dict:
    """Compile ``schema`` with llguidance and replay ``tokens`` (see the module docstring); times in us/ms."""
    import llguidance
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask, fill_next_token_bitmask_par

    t0 = time.perf_counter_ns()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    grammar_ns = time.perf_counter_ns() - t0
    create_ns = []
    for _ in range(2):
        t0 = time.perf_counter_ns()
        matcher = llguidance.LLMatcher(llg_tokenizer, grammar)
        create_ns.append(time.perf_counter_ns() - t0)
        if matcher.is_error():
            return {"status": "error", "error": matcher.get_error()}
    out = {"status": "ok", "grammar_from_json_schema_ms": grammar_ns / 1e6,
           "matcher_create_ms": create_ns[0] / 1e6, "matcher_create_again_ms": create_ns[1] / 1e6}

    vocab = llg_tokenizer.vocab_size
    mask = allocate_token_bitmask(1, vocab)
    mask_ns, consume_ns = [], []
    for rep in range(repeats):
        matcher = llguidance.LLMatcher(llg_tokenizer, grammar)
        for pos, tok in enumerate(tokens):
            t0 = time.perf_counter_ns()
            fill_next_token_bitmask(matcher, mask)
            mask_ns.append(time.perf_counter_ns() - t0)
            if not _allowed(mask[0], tok):
                return {**out, "status": "rejected", "rejected_at": pos, "error": matcher.get_error()}
            t0 = time.perf_counter_ns()
            ok = matcher.consume_token(tok)
            consume_ns.append(time.perf_counter_ns() - t0)
            if not ok:
                return {**out, "status": "rejected", "rejected_at": pos, "error": matcher.get_error()}
        t0 = time.perf_counter_ns()
        fill_next_token_bitmask(matcher, mask)
        mask_ns.append(time.perf_counter_ns() - t0)
        if not (matcher.is_accepting() and _allowed(mask[0], EOS_ID)):
            return {**out, "status": "rejected", "rejected_at": len(tokens), "error": "not accepting at the end"}
    out["mask_us"] = summarize(mask_ns)
    out["consume_us"] = summarize(consume_ns)

    if batch > 0:
        if executor is None:
            executor = llguidance.LLExecutor()
        matchers = [llguidance.LLMatcher(llg_tokenizer, grammar) for _ in range(batch)]
        rows = [(m, i) for i, m in enumerate(matchers)]
        bmask = allocate_token_bitmask(batch, vocab)
        step_ns = []
        for tok in [*tokens, None]:
            t0 = time.perf_counter_ns()
            fill_next_token_bitmask_par(executor, rows, bmask)
            step_ns.append(time.perf_counter_ns() - t0)
            if tok is None:
                break
            if not all(_allowed(bmask[i], tok) for i in range(batch)):
                return {**out, "status": "rejected", "error": "batched mask rejected a token"}
            for m in matchers:
                m.consume_token(tok)
        step = summarize(step_ns)
        out[f"batch{batch}_step_us"] = step
        out[f"batch{batch}_per_row_median_us"] = step["median"] / batch
    return out


# -------------------------------------------------------------------------------------- outlines-core


def _byte_decoder() -> dict[str, int]:
    """The inverse of the byte-level BPE alphabet (each byte is shown as one printable character)."""
    shown = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in shown:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def token_bytes(tokenizer_json: str) -> tuple[dict[int, bytes], set[int]]:
    """Every token id's bytes (byte-level BPE ``tokenizer.json``) and the ids of the special tokens."""
    data = json.loads(tokenizer_json)
    dec = _byte_decoder()
    out = {i: bytes(dec[c] for c in tok) for tok, i in data["model"]["vocab"].items()}
    special = set()
    for added in data.get("added_tokens", ()):
        out[added["id"]] = added["content"].encode()
        if added.get("special"):
            special.add(added["id"])
    return out, special


def outlines_vocabulary(tokenizer_json: str):
    """An ``outlines_core.Vocabulary`` of the tokenizer (special tokens left out; EOS is id 0)."""
    import outlines_core

    pieces, special = token_bytes(tokenizer_json)
    grouped: dict[bytes, list[int]] = {}
    for i, b in sorted(pieces.items()):
        if i not in special:
            grouped.setdefault(b, []).append(i)
    return outlines_core.Vocabulary(EOS_ID, grouped)


def measure_outlines(tokenizer_json: str, schema: dict, tokens: list[int]) -> dict:
    """Build the outlines-core index of ``schema`` and replay ``tokens``; runs in the calling process."""
    import outlines_core

    t0 = time.perf_counter_ns()
    try:
        regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(schema))
    except Exception as e:  # the translator refuses what it cannot express
        return {"status": "unsupported", "error": f"{type(e).__name__}: {e}"}
    out = {"status": "ok", "regex_ms": (time.perf_counter_ns() - t0) / 1e6, "regex_chars": len(regex)}
    t0 = time.perf_counter_ns()
    vocab = outlines_vocabulary(tokenizer_json)
    out["vocabulary_ms"] = (time.perf_counter_ns() - t0) / 1e6
    t0 = time.perf_counter_ns()
    try:
        index = outlines_core.Index(regex, vocab)
    except Exception as e:
        return {**out, "status": "unsupported", "error": f"Index: {type(e).__name__}: {e}"}
    out["index_s"] = (time.perf_counter_ns() - t0) / 1e9
    t0 = time.perf_counter_ns()
    guide = outlines_core.Guide(index)
    out["guide_create_ms"] = (time.perf_counter_ns() - t0) / 1e6

    num_tokens = max(max(json.loads(tokenizer_json)["model"]["vocab"].values()), max(tokens, default=0)) + 1
    mask = np.zeros((1, (num_tokens + 31) // 32), dtype=np.int32)
    ptr, size, itemsize = mask.ctypes.data, mask.size, mask.itemsize
    mask_ns, advance_ns = [], []
    for pos, tok in enumerate(tokens):
        t0 = time.perf_counter_ns()
        guide.write_mask_into(ptr, size, itemsize)
        mask_ns.append(time.perf_counter_ns() - t0)
        if not _allowed(mask[0], tok):
            return {**out, "status": "rejected", "rejected_at": pos, "mask_us": summarize(mask_ns)}
        t0 = time.perf_counter_ns()
        guide.advance(tok, return_tokens=False)
        advance_ns.append(time.perf_counter_ns() - t0)
    t0 = time.perf_counter_ns()
    guide.write_mask_into(ptr, size, itemsize)
    mask_ns.append(time.perf_counter_ns() - t0)
    if not (guide.is_finished() and _allowed(mask[0], EOS_ID)):
        return {**out, "status": "rejected", "rejected_at": len(tokens), "error": "not final at the end"}
    out["mask_us"] = summarize(mask_ns)
    out["advance_us"] = summarize(advance_ns)
    return out


def _outlines_worker() -> None:
    """Subprocess entry: read {tokenizer_path, schema, tokens} on stdin, print the result JSON."""
    job = json.load(sys.stdin)
    result = measure_outlines(Path(job["tokenizer_path"]).read_text(), job["schema"], job["tokens"])
    print(json.dumps(result))


def measure_outlines_subprocess(tokenizer_path: str | Path, schema: dict, tokens: list[int],
                                timeout_s: float = 120.0) -> dict:
    """``measure_outlines`` in a fresh interpreter, killed after ``timeout_s`` (recorded as ``timeout``)."""
    job = json.dumps({"tokenizer_path": str(tokenizer_path), "schema": schema, "tokens": tokens})
    cmd = [sys.executable, "-c", "from bench.structured.mask_cost import _outlines_worker; _outlines_worker()"]
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, input=job, capture_output=True, text=True, timeout=timeout_s, cwd=root, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "timeout_s": timeout_s}
    if proc.returncode != 0:
        return {"status": "error", "returncode": proc.returncode, "error": proc.stderr.strip()[-2000:]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["subprocess_s"] = time.perf_counter() - start
    return result


# ----------------------------------------------------------------------------------- keyword coverage

COVERAGE_PROBES = (  # (keyword, schema of the value, valid value text, invalid value text); see coverage()
    ("minimum/maximum", {"type": "integer", "minimum": 0, "maximum": 9}, "7", "12"),
    ("exclusiveMinimum", {"type": "number", "exclusiveMinimum": 0}, "0.5", "0"),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, "15", "7"),
    ("pattern", {"type": "string", "pattern": "^[a-z]{3}$"}, '"abc"', '"ABCD"'),
    ("format:date", {"type": "string", "format": "date"}, '"2026-12-03"', '"2026-13-45"'),
    ("format:date-time", {"type": "string", "format": "date-time"}, '"2026-12-03T14:05:09Z"', '"yesterday"'),
    ("format:email", {"type": "string", "format": "email"}, '"a@example.com"', '"not an email"'),
    ("format:uuid", {"type": "string", "format": "uuid"}, '"3f2b8c1e-9a4d-4c7e-b5a1-2d6f0e8c9b7a"', '"xyz"'),
    ("format:hostname", {"type": "string", "format": "hostname"}, '"example.com"', '"-bad host-"'),
    ("minLength/maxLength", {"type": "string", "minLength": 2, "maxLength": 3}, '"abc"', '"abcdef"'),
    ("minItems/maxItems", {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
     "[1, 2]", "[1, 2, 3]"),
    ("enum", {"enum": ["red", "green"]}, '"red"', '"blue"'),
    ("const", {"const": "v1"}, '"v1"', '"v2"'),
    ("required", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, '{"a": 1}',
     "{}"),
    ("additionalProperties:false", {"type": "object", "properties": {"a": {"type": "integer"}},
                                    "additionalProperties": False}, '{"a": 1}', '{"a": 1, "b": 2}'),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, "true", '"s"'),
    ("$ref", {"$ref": "#/$defs/p"}, "3", '"s"'),
    ("recursive $ref, depth 4", {"$ref": "#/$defs/n"}, '{"k": [{"k": [{"k": [{"k": [{"k": []}]}]}]}]}',
     '{"k": [{"j": []}]}'),
    ("nullable type list", {"type": ["integer", "null"]}, "null", '"x"'),
)
_PROBE_DEFS = {"p": {"type": "integer"},
               "n": {"type": "object", "properties": {"k": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                     "required": ["k"], "additionalProperties": False}}
# A bare number at the top level (no enclosing object): outlines-core 0.2.14 rejects "0.5" there (it accepts
# it inside an object), so this one is kept apart from the keyword probes, unwrapped.
TOP_LEVEL_PROBES = (("top-level number", {"type": "number"}, "0.5", '"x"'),)


def _wrap(schema: dict, text: str) -> tuple[dict, str]:
    """Put the probed value in a required property ``v`` of an object (structured outputs are objects)."""
    return {"$defs": _PROBE_DEFS, "type": "object", "properties": {"v": schema}, "required": ["v"],
            "additionalProperties": False}, '{"v": ' + text + "}"


def _llguidance_accepts(llg_tokenizer, schema: dict, tokens: list[int]) -> bool | str:
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    err = llguidance.LLMatcher.validate_grammar(grammar, llg_tokenizer)
    if err:
        return f"unsupported: {err}"
    m = llguidance.LLMatcher(llg_tokenizer, grammar, log_level=0)
    return all(m.consume_token(t) for t in tokens) and m.is_accepting()


def _outlines_accepts(vocab, schema: dict, tokens: list[int]) -> bool | str:
    import outlines_core

    try:
        index = outlines_core.Index(outlines_core.json_schema.build_regex_from_schema(json.dumps(schema)), vocab)
    except Exception as e:
        return f"unsupported: {type(e).__name__}: {e}"
    state = index.get_initial_state()
    for t in tokens:
        state = index.get_next_state(state, t)
        if state is None:
            return False
    return index.is_final_state(state)


def coverage(tokenizer_json: str, backends: tuple[str, ...]) -> list[dict]:
    """For each probe and backend: accepts the valid text, rejects the invalid one, hence ``enforced``
    (``ignored`` when both are accepted, ``rejects_valid`` when the valid one is refused)."""
    rows = []
    llg_tok = llguidance_tokenizer(tokenizer_json)[0] if "llguidance" in backends else None
    oc_vocab = outlines_vocabulary(tokenizer_json) if "outlines-core" in backends else None
    probes = [(k, *_wrap(s, good), _wrap(s, bad)[1]) for k, s, good, bad in COVERAGE_PROBES]
    probes += [(k, s, good, bad) for k, s, good, bad in TOP_LEVEL_PROBES]
    for keyword, schema, good, bad in probes:
        row = {"keyword": keyword, "schema": schema, "valid": good, "invalid": bad}
        for backend in backends:
            if backend == "llguidance":
                def accepts(text):
                    return _llguidance_accepts(llg_tok, schema, encode(tokenizer_json, text))
            else:
                def accepts(text):
                    return _outlines_accepts(oc_vocab, schema, encode(tokenizer_json, text))
            ok_good = accepts(good)
            if isinstance(ok_good, str):
                row[backend] = {"status": "unsupported", "error": ok_good}
                continue
            ok_bad = accepts(bad)
            row[backend] = {"accepts_valid": ok_good, "rejects_invalid": not ok_bad,
                            "status": "enforced" if ok_good and not ok_bad else
                            ("ignored" if ok_good else "rejects_valid")}
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------- the run


def _package_info(dist: str, module: str) -> dict:
    from importlib import metadata, util

    info = {"version": None, "install_bytes": None}
    try:
        info["version"] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return info
    spec = util.find_spec(module)
    if spec and spec.submodule_search_locations:
        folder = Path(list(spec.submodule_search_locations)[0])
        info["install_bytes"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    try:
        info["requires"] = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        pass
    return info


def _machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _pooled(results: list[dict], backend: str, key: str) -> dict:
    """Pool the per-token medians/p99 of one backend over a group of schemas (median of the per-schema values)."""
    vals = [r[backend][key] for r in results if r.get(backend, {}).get("status") == "ok" and key in r[backend]]
    if not vals:
        return {}
    return {"schemas": len(vals), "median_of_medians": float(np.median([v["median"] for v in vals])),
            "median_of_p99": float(np.median([v["p99"] for v in vals])),
            "max_p99": float(max(v["p99"] for v in vals))}


def run(args) -> dict:
    import llguidance

    from bench import report
    from bench.structured.tokenizers import build_tokenizer

    names = set(args.schemas.split(",")) if args.schemas else None
    sizes = set(args.sizes.split(","))
    suite = [(n, s) for n, s in SCHEMAS if (names is None or n in names) and SIZES[n] in sizes]
    backends = tuple(b for b in args.backends.split(",") if b)
    if "outlines-core" in backends:
        try:
            import outlines_core  # noqa: F401
        except ImportError:
            print("outlines-core is not importable: its measurements are skipped")
            backends = tuple(b for b in backends if b != "outlines-core")
    large_vocab_outlines = set(args.outlines_large_vocab_schemas.split(",")) if args.outlines_large_vocab_schemas \
        else set()

    tokenizers = {}
    for label in args.tokenizers.split(","):
        if label == "embedded":
            tokenizers[label] = EMBEDDED_TOKENIZER
        elif label == "bpe150k":
            start = time.perf_counter()
            build_tokenizer(args.tokenizer_cache, vocab_size=args.vocab_size)
            print(f"150k tokenizer ready in {time.perf_counter() - start:.1f} s ({args.tokenizer_cache})")
            tokenizers[label] = Path(args.tokenizer_cache)
        else:
            raise SystemExit(f"unknown tokenizer {label!r} (embedded, bpe150k)")

    executor = llguidance.LLExecutor(args.threads) if args.threads else llguidance.LLExecutor()
    payload = {
        "experiment": "structured-mask-cost",
        "machine": _machine(),
        "packages": {"llguidance": _package_info("llguidance", "llguidance"),
                     "outlines-core": _package_info("outlines_core", "outlines_core")},
        "settings": {"repeats": args.repeats, "batch": args.batch, "threads": args.threads or "default",
                     "outlines_timeout_s": args.outlines_timeout,
                     "outlines_large_vocab_schemas": sorted(large_vocab_outlines)},
        "tokenizers": {}, "results": [], "summary": [], "coverage": [],
    }
    for label, path in tokenizers.items():
        tok_json = Path(path).read_text()
        llg_tok, llg_tok_ms = llguidance_tokenizer(tok_json)
        info = {"path": str(path), "vocab_size": llg_tok.vocab_size, "llguidance_tokenizer_ms": llg_tok_ms}
        if "outlines-core" in backends:
            t0 = time.perf_counter()
            outlines_vocabulary(tok_json)
            info["outlines_vocabulary_ms"] = (time.perf_counter() - t0) * 1e3
        payload["tokenizers"][label] = info
        for name, schema in suite:
            text = instance_text(schema)
            tokens = encode(tok_json, text)
            row = {"tokenizer": label, "schema": name, "size": SIZES[name], "instance_chars": len(text),
                   "tokens": len(tokens)}
            if "llguidance" in backends:
                row["llguidance"] = measure_llguidance(llg_tok, schema, tokens, repeats=args.repeats,
                                                       batch=args.batch, executor=executor)
            if "outlines-core" in backends:
                if label != "embedded" and name not in large_vocab_outlines:
                    row["outlines-core"] = {"status": "not_run",
                                            "reason": "not in --outlines-large-vocab-schemas (time budget)"}
                else:
                    row["outlines-core"] = measure_outlines_subprocess(path, schema, tokens, args.outlines_timeout)
            payload["results"].append(row)
            _print_progress(row)
        for size in ("small", "medium", "large"):
            group = [r for r in payload["results"] if r["tokenizer"] == label and r["size"] == size]
            if not group:
                continue
            summary = {"tokenizer": label, "size": size, "schemas": len(group)}
            for backend in backends:
                key = "mask_us"
                summary[backend] = _pooled(group, backend, key)
                statuses = [r[backend]["status"] for r in group]
                summary[backend]["statuses"] = {s: statuses.count(s) for s in sorted(set(statuses))}
            if "llguidance" in backends:
                summary[f"llguidance_batch{args.batch}"] = _pooled(group, "llguidance", f"batch{args.batch}_step_us")
            payload["summary"].append(summary)
    if args.coverage:
        payload["coverage"] = coverage(EMBEDDED_TOKENIZER.read_text(), backends)
    _print_tables(payload, backends, args.batch)
    report.write_json(args.output, payload)
    return payload


def _fmt_status(res: dict | None, key: str = "mask_us") -> str:
    if not res:
        return "-"
    if res.get("status") != "ok":
        return res.get("status", "?")
    m = res[key]
    return f"{m['median']:.1f} / {m['p99']:.1f}"


def _print_progress(row: dict) -> None:
    parts = [f"{row['tokenizer']:>8} {row['schema']:<22} {row['tokens']:>4} tok"]
    for backend in ("llguidance", "outlines-core"):
        if backend in row:
            parts.append(f"{backend}: {_fmt_status(row[backend])}")
    print("  ".join(parts), flush=True)


def _print_tables(payload: dict, backends: tuple[str, ...], batch: int) -> None:
    from bench import report

    rows = []
    for r in payload["results"]:
        llg = r.get("llguidance", {})
        oc = r.get("outlines-core", {})
        rows.append([
            r["tokenizer"], r["schema"], r["size"], r["tokens"],
            _fmt_status(llg), _fmt_status(llg, f"batch{batch}_step_us") if llg.get("status") == "ok" else "-",
            llg.get("matcher_create_ms", "-"),
            _fmt_status(oc) if oc else "-", oc.get("index_s", "-") if oc else "-",
        ])
    report.print_table("mask time per token, us (median / p99)",
                       ["tokenizer", "schema", "size", "tokens", "llg 1 row", f"llg {batch} rows/step",
                        "llg compile ms", "outlines", "outlines index s"], rows)
    rows = []
    for s in payload["summary"]:
        for backend in (*backends, f"llguidance_batch{batch}"):
            p = s.get(backend) or {}
            if p.get("schemas"):
                rows.append([s["tokenizer"], s["size"], backend, p["schemas"], p["median_of_medians"],
                             p["median_of_p99"], p["max_p99"]])
            elif p:
                rows.append([s["tokenizer"], s["size"], backend, 0, "-", "-", str(p.get("statuses"))])
    report.print_table("per size: median over schemas of the per-token median / p99 (us)",
                       ["tokenizer", "size", "backend", "schemas", "median", "p99", "max p99"], rows)
    if payload["coverage"]:
        rows = [[c["keyword"], *[c.get(b, {}).get("status", "-") for b in backends]] for c in payload["coverage"]]
        report.print_table("keyword coverage (embedded tokenizer)", ["keyword", *backends], rows)


def add_arguments(p) -> None:
    p.add_argument("--output", default=None, help="write the JSON of all numbers here")
    p.add_argument("--tokenizers", default="embedded,bpe150k", help="comma list of: embedded, bpe150k")
    p.add_argument("--tokenizer-cache", default=str(DEFAULT_TOKENIZER_CACHE),
                   help="where the trained 150k tokenizer is cached (trained there on first use, ~1 min)")
    p.add_argument("--vocab-size", type=int, default=150_000, help="size of the trained BPE tokenizer")
    p.add_argument("--schemas", default="", help="comma list of schema names (default: the whole suite)")
    p.add_argument("--sizes", default="small,medium,large", help="comma list of size tags to run")
    p.add_argument("--backends", default="llguidance,outlines-core", help="comma list: llguidance, outlines-core")
    p.add_argument("--repeats", type=int, default=3, help="single-row llguidance replays per schema (pooled)")
    p.add_argument("--batch", type=int, default=16, help="rows of the batched llguidance mask (0: skip)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="LLExecutor threads (0: its default)")
    p.add_argument("--outlines-timeout", type=float, default=120.0, help="seconds per outlines-core schema")
    p.add_argument("--outlines-large-vocab-schemas", default=",".join(DEFAULT_OUTLINES_LARGE_VOCAB),
                   help="schemas outlines-core builds on the large tokenizer (its index builds are slow)")
    p.add_argument("--no-coverage", dest="coverage", action="store_false", help="skip the keyword probes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.structured.mask_cost",
                                     description=(__doc__ or "").splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
