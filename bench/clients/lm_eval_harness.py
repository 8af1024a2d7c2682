"""lm-evaluation-harness (``lm_eval``, the ``local-completions`` model) against the server, one task per run.

The tasks are this folder's ``lm_eval_tasks/`` (local JSONL + task YAML, loaded with ``--include_path .``
from that folder, which their ``data_files`` are relative to): ``jaxinfer_arith`` (``generate_until``,
4-shot "a + b =", exact match of the first number), ``jaxinfer_code_choice`` (``multiple_choice``: four
continuations of a Python snippet scored by loglikelihood, acc / acc_norm) and ``jaxinfer_sentences``
(``loglikelihood_rolling``: short English sentences, word / byte perplexity and bits per byte).

How lm-eval talks to the server: requests go to ``/v1/completions`` as token ids (``tokenized_requests``,
the default), so lm-eval needs the model's tokenizer on the client side: ``tokenizer_backend=huggingface``
with ``tokenizer=`` the model directory (``transformers.AutoTokenizer`` reads its ``tokenizer.json``; no
torch). The ``remote`` backend would ask the server's ``/tokenizer_info``, which jaxinfer does not serve, and
``tokenizer_backend=None`` cannot run loglikelihood tasks (lm-eval needs token counts to split context
from continuation). Generation sends ``{"prompt": [ids], "max_tokens": 8, "stop": [...], "seed": ...}``;
loglikelihood sends ``{"prompt": [ids], "echo": true, "logprobs": 1, "max_tokens": 1, "temperature": 0}``
and sums ``choices[0].logprobs.token_logprobs[ctxlen:-1]`` (the prompt's logprobs: prompt logprobs on the
server). ``max_length`` is the server's context length (``/v1/models``), ``max_retries=1`` so that a refused
request fails the run at once instead of after backoff.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

from bench.clients.common import FAILED, OK, SKIPPED, ClientResult, first_error_line, run_command, shown, tool_version

TASK_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"
TASKS = {  # task -> its output type
    "jaxinfer_arith": "generate_until",
    "jaxinfer_code_choice": "multiple_choice",
    "jaxinfer_sentences": "loglikelihood_rolling",
}
PENDING: dict[str, str] = {}  # check -> the server feature it waits for (none today)
NUM_CONCURRENT = 8


def model_args(url: str, model: str, tokenizer_dir: str | Path, max_length: int) -> str:
    return ",".join([f"model={model}", f"base_url={url.rstrip('/')}/v1/completions", "tokenizer_backend=huggingface",
                     f"tokenizer={tokenizer_dir}", f"max_length={max_length}", f"num_concurrent={NUM_CONCURRENT}",
                     "max_retries=1", "timeout=600"])


def command(prefix: list[str], url: str, model: str, tokenizer_dir: str | Path, max_length: int, task: str,
            output_path: str | Path) -> list[str]:
    return [*prefix, "--model", "local-completions",
            "--model_args", model_args(url, model, tokenizer_dir, max_length),
            "--include_path", ".", "--tasks", task, "--output_path", str(output_path)]


def environment(work_dir: Path, api_key: str | None) -> dict:
    """Nothing from the Hub (the tasks are local), a private datasets cache, the API key lm-eval sends."""
    return {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(work_dir / "hf_datasets"),
            "TOKENIZERS_PARALLELISM": "false", "OPENAI_API_KEY": api_key or ""}


def read_scores(output_path: Path, task: str) -> dict:
    """The task's metrics (``"metric,filter"`` names, stderrs left out) and sample count from lm-eval's
    ``results_*.json``."""
    files = sorted(glob.glob(str(output_path / "**" / "results_*.json"), recursive=True), key=os.path.getmtime)
    if not files:
        raise FileNotFoundError(f"lm-eval wrote no results_*.json under {output_path}")
    data = json.loads(Path(files[-1]).read_text())
    got = data["results"][task]
    scores = {k: v for k, v in got.items() if "," in k and "_stderr" not in k and isinstance(v, (int, float))}
    return {**scores, "samples": data.get("n-samples", {}).get(task, {}).get("effective")}


def run_task(prefix: list[str], version: str | None, url: str, model: str, tokenizer_dir: str | Path,
             max_length: int, task: str, work_dir: Path, api_key: str | None = None,
             timeout_s: float = 1200.0) -> ClientResult:
    out = work_dir / f"lm_eval_{task}"
    cmd = command(prefix, url, model, tokenizer_dir, max_length, task, out)
    row = ClientResult("lm-eval", f"{task} ({TASKS[task]})", version,
                       f"cd {TASK_DIR.relative_to(TASK_DIR.parents[2])} && {shown(cmd)}", pending=PENDING.get(task))
    done = run_command(cmd, cwd=TASK_DIR, env=environment(work_dir, api_key), timeout_s=timeout_s,
                       log_path=work_dir / f"lm_eval_{task}.log")
    row.seconds = done.seconds
    if done.returncode != 0:
        row.result, row.error = FAILED, first_error_line(done.output)
        return row
    try:
        row.numbers = read_scores(out, task)
    except (OSError, KeyError, ValueError) as exc:
        row.result, row.error = FAILED, f"{type(exc).__name__}: {exc}"
        return row
    row.result = OK
    return row


def run_all(prefix: list[str] | None, url: str, model: str, tokenizer_dir: str | Path, max_length: int,
            work_dir: Path, api_key: str | None = None, tasks=tuple(TASKS)) -> list[ClientResult]:
    if prefix is None:
        return [ClientResult("lm-eval", "all", None, 'pip install "lm-eval[api]" transformers', result=SKIPPED,
                             error="lm_eval is not installed (the clients extra; or pass --lm-eval CMD)")]
    version = tool_version(prefix, "lm_eval")
    return [run_task(prefix, version, url, model, tokenizer_dir, max_length, t, work_dir, api_key) for t in tasks]
