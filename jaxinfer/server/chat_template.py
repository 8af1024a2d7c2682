"""Chat templates: a checkpoint's jinja2 template turns chat messages into the prompt text.

The template comes from the checkpoint, as transformers looks for it: ``tokenizer_config.json``'s
``chat_template`` (a string, or a list of ``{"name", "template"}`` of which "default" is used), else a
``chat_template.jinja`` file beside it. It renders in jinja2's immutable sandbox (a template is code from a
downloaded file: no attribute access to Python internals, no mutation of the arguments), with the names
HF templates use: ``messages``, ``tools``, ``add_generation_prompt``, ``bos_token``, ``eos_token``,
``raise_exception(msg)`` and ``strftime_now(fmt)``. A template error (including ``raise_exception``) is a
``ValueError`` with its message: a bad conversation is the client's error.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_FILE = "chat_template.jinja"


def load_chat_template(model_dir: str | Path | None) -> str | None:
    """The checkpoint's chat template source, or None when it has none."""
    if model_dir is None:
        return None
    model_dir = Path(model_dir)
    cfg_path = model_dir / "tokenizer_config.json"
    if cfg_path.is_file():
        template = json.loads(cfg_path.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if isinstance(template, str) and template:
            return template
    path = model_dir / TEMPLATE_FILE
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template; ``render(messages)`` returns the prompt text."""

    def __init__(self, source: str, bos_token: str | None = None, eos_token: str | None = None):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ValueError(f"the chat template does not compile: {exc}") from exc
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
        """The prompt text; ``tools`` (OpenAI's function tools) reach the template as ``tools``, as in HF."""
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, tools=tools)
        except jinja2.TemplateError as exc:
            raise ValueError(f"the chat template rejected the messages: {exc}") from exc
