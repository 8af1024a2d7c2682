"""Third-party clients, unmodified, against one live server (a real uvicorn server on a free port with the
embedded model, started in a thread as tests/server/test_server.py does): every check of the openai SDK
(``bench.clients.openai_sdk``) and the three lm-evaluation-harness tasks of ``bench/clients/lm_eval_tasks``
through ``lm_eval --model local-completions`` (``bench.clients.lm_eval_harness``; skipped where lm_eval is not
installed: ``pip install -e ".[clients]"``, or an ``lm_eval`` on PATH).

lm-eval's multiple_choice and loglikelihood_rolling tasks score prompts through ``echo`` + ``logprobs`` (the
prompt's logprobs) on ``/v1/completions``.
"""

from __future__ import annotations

import math

import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from bench.clients import lm_eval_harness, openai_sdk  # noqa: E402
from bench.clients.common import OK, first_error_line, tool_command, tool_version  # noqa: E402
from jaxinfer.loading.model_source import default_model_dir  # noqa: E402
from jaxinfer.server import launch  # noqa: E402
from tests.server.test_server import live_server  # noqa: E402

KEY = "clients-key"
MAX_MODEL_LEN = 256
ENGINE = ["--compilation", "lazy", "--max-num-seqs", "32", "--max-model-len", str(MAX_MODEL_LEN), "--seed", "0"]


@pytest.fixture(scope="module")
def served():
    with live_server([*ENGINE, "--api-key", KEY]) as (url, _):
        yield url, launch.DEFAULT_MODEL_NAME


@pytest.fixture(scope="module")
def client(served):
    return openai_sdk.make_client(served[0], KEY)


# ------------------------------------------------------------------------------------------------ openai SDK
@pytest.mark.parametrize("name", [c.name for c in openai_sdk.CHECKS])
def test_openai_sdk(name, served, client):
    check = next(c for c in openai_sdk.CHECKS if c.name == name)
    numbers = check.fn(client, served[1])  # raises (AssertionError, or the SDK's error) on a wrong answer
    assert numbers and all(v is None or isinstance(v, (int, float)) for v in numbers.values()), numbers


def test_openai_rows_say_ok_or_the_first_error_line(served):
    """run_check turns a check into a row; an SDK error becomes one line naming the exception and status."""
    client = openai_sdk.make_client(served[0], "wrong-key")
    row = openai_sdk.run_check(openai_sdk.CHECKS[0], client, served[1], openai.__version__)
    assert row.result == "failed" and row.error.startswith("openai.AuthenticationError: Error code: 401"), row.error
    assert "\n" not in row.error
    good = openai_sdk.run_check(openai_sdk.CHECKS[0], openai_sdk.make_client(served[0], KEY), served[1], "x")
    assert good.result == OK and good.numbers["completion_tokens"] > 0, good


# --------------------------------------------------------------------------------------------------- lm-eval
@pytest.fixture(scope="module")
def lm_eval_cmd():
    cmd = tool_command(None, "lm_eval", "lm_eval")
    if cmd is None:
        pytest.skip('lm_eval is not installed: pip install -e ".[clients]" (lm-eval[api]; no torch needed)')
    return cmd


@pytest.mark.parametrize("task", list(lm_eval_harness.TASKS))
def test_lm_eval_task_runs_and_scores(task, served, lm_eval_cmd, tmp_path):
    row = lm_eval_harness.run_task(lm_eval_cmd, tool_version(lm_eval_cmd, "lm_eval"), served[0], served[1],
                                   default_model_dir(), MAX_MODEL_LEN, task, tmp_path, api_key=KEY, timeout_s=900)
    assert row.result == OK, f"{row.error}\n(log: {tmp_path / f'lm_eval_{task}.log'})"
    scores = {k.split(",")[0]: v for k, v in row.numbers.items() if "," in k}
    assert row.numbers["samples"] > 0, row.numbers
    kind = lm_eval_harness.TASKS[task]
    if kind == "generate_until":
        assert 0.0 <= scores["exact_match"] <= 1.0, scores
    elif kind == "multiple_choice":
        assert 0.0 <= scores["acc"] <= 1.0 and 0.0 <= scores["acc_norm"] <= 1.0, scores
    else:  # loglikelihood_rolling
        assert math.isfinite(scores["word_perplexity"]) and scores["word_perplexity"] > 1.0, scores
        assert scores["bits_per_byte"] > 0.0, scores


# ---------------------------------------------------------------------------------------- the error line
@pytest.mark.parametrize("text, expected", [
    ("INFO start\nWARNING [api_models:521] API request failed! Status code: 500, Response text: {\"error\": 1}. "
     "Retrying...\nTraceback (most recent call last):\n  File \"x\", line 1\nRuntimeError: Session is closed\n",
     "Status code: 500, Response text: {\"error\": 1}. Retrying..."),
    ("Traceback (most recent call last):\n  File \"x\", line 1\nValueError: bad value\n", "ValueError: bad value"),
    ("INFO fine\nsomething went wrong: error in step\nbye\n", "something went wrong: error in step"),
    ("", "(no output)"),
])
def test_first_error_line(text, expected):
    assert first_error_line(text) == expected
