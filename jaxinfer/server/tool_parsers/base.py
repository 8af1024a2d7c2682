"""Tool calls in model output: the data types, the parser interface, its streaming and its grammar.

A parser reads one model family's tool-call markup (hermes, llama3_json, mistral: the names vLLM's
``--tool-call-parser`` uses). It defines one function, ``_step(text, pos, final, after_call)``, which classifies
the text from ``pos`` on: a run of plain text (``Text``), one markup block with the calls it holds (``Calls``), or
``None`` ("cannot tell yet": only while ``final`` is false, i.e. more text may come). ``extract`` and the streamer
both walk the text with that one function, so they agree by construction, given the rule every ``_step`` keeps:
a decision taken on a prefix (``final`` false) is the decision taken on every longer text. Plain text that might
be the start of a markup tag, a block whose end is not in sight, a JSON value not yet closed: all answer ``None``.

Content (``ExtractedToolCalls.content``) is the text outside the valid markup blocks, concatenated and stripped
of leading and trailing whitespace (None when nothing is left). A block whose JSON does not parse, or is not a
call (a ``name`` string and an object of arguments), is left in the content as written, as vLLM does.

Streaming (``ToolParser.streamer()``): ``feed(delta)`` returns OpenAI delta pieces; ``finish()`` flushes. The
guarantees: the ``content`` pieces concatenate to exactly ``extract(whole_text).content or ""`` (leading
whitespace is dropped, trailing whitespace is held until more content follows, and dropped at the end); no piece
holds markup of a valid call or text that might still turn out to be the start of one; for each call index the
header piece (id, type, name, ``arguments: ""``) comes first, and the argument pieces concatenate to exactly the
``arguments`` string ``extract`` gives that call. A call is sent whole once its block is complete (its JSON closed
and, for hermes, its ``</tool_call>`` seen, or the text ended): before that the markup could still prove malformed
and belong to the content, so no part of it is sent early.

``arguments`` is ``json.dumps(args, ensure_ascii=False)`` of the parsed arguments object (vLLM's form: ``", "``
and ``": "`` separators), not the model's own spelling.

Constraint (``ToolParser.constraint``): a Lark grammar for llguidance that forces the output to be tool calls in
the parser's format, each call a ``%json`` schema: an object with ``name`` a ``const`` of one tool's name and the
arguments validating against that tool's ``parameters``. Each tool's schema is compiled on its own first, so a
schema llguidance cannot compile raises ``ValueError`` naming the tool.
"""

from __future__ import annotations

import json
import random
import string
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

ID_ALPHABET = string.ascii_letters + string.digits
_SYSTEM_RANDOM = random.SystemRandom()


def random_alphanumerics(n: int) -> str:
    return "".join(_SYSTEM_RANDOM.choice(ID_ALPHABET) for _ in range(n))


def make_call_id() -> str:
    """An OpenAI-style tool call id: ``call_`` and 24 random alphanumerics."""
    return "call_" + random_alphanumerics(24)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ExtractedToolCalls:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)

    @property
    def tools_called(self) -> bool:
        return bool(self.tool_calls)


# ---- the steps a parser's _step answers -------------------------------------------------------------------

@dataclass(frozen=True)
class Text:
    """``text[pos:end]`` is plain content."""
    end: int


@dataclass(frozen=True)
class Calls:
    """``text[pos:end]`` is one markup block holding these (name, arguments object) calls."""
    end: int
    calls: tuple[tuple[str, dict], ...]


Step = Text | Calls | None


# ---- helpers the parsers share --------------------------------------------------------------------------

def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


# NaN and Infinity are not JSON: a call holding them is malformed (json.dumps would write them back as is)
JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_WHITESPACE = " \t\r\n"


def skip_whitespace(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def decode_json_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value starting exactly at ``pos`` and where it ends, or None if there is none (yet)."""
    try:
        return JSON_DECODER.raw_decode(text, pos)
    except (ValueError, RecursionError):
        return None


def loads_json(text: str) -> tuple[bool, Any]:
    try:
        return True, JSON_DECODER.decode(text)
    except (ValueError, RecursionError):
        return False, None


def plain_text_end(text: str, pos: int, tag: str, final: bool) -> tuple[int, bool]:
    """``(end, found)``: ``text[pos:end]`` is plain text with respect to ``tag``; ``found`` says the tag starts at
    ``end``. Without ``final`` a tail of the text that is a prefix of the tag is held back."""
    i = text.find(tag, pos)
    if i >= 0:
        return i, True
    if final:
        return len(text), False
    for k in range(min(len(tag) - 1, len(text) - pos), 0, -1):
        if text.endswith(tag[:k]):
            return len(text) - k, False
    return len(text), False


def call_from_object(obj: Any, argument_keys: Sequence[str]) -> tuple[str, dict] | None:
    """(name, arguments) of a decoded call object, or None if it is not one: a dict with a non-empty string
    ``name`` and, under the first of ``argument_keys`` present, a JSON object (or a string holding one)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    for key in argument_keys:
        if key in obj:
            args = obj[key]
            if isinstance(args, str):
                ok, args = loads_json(args)
                if not ok:
                    return None
            return (obj["name"], args) if isinstance(args, dict) else None
    return None


def dump_arguments(args: dict) -> str:
    return json.dumps(args, ensure_ascii=False)


# ---- grammar helpers ------------------------------------------------------------------------------------

# How the forced JSON is spelled: one space after ':' and ',' (how Qwen, Llama and Mistral write their calls), no
# other whitespace. Fixed spelling also keeps the model from padding the output with whitespace.
JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_rule(schema: dict) -> str:
    """The Lark ``%json`` body for ``schema``, in the fixed spelling."""
    return "%json " + json.dumps({"x-guidance": JSON_FORMAT, **schema}, ensure_ascii=False)


def lark_literal(s: str, special_tokens: Mapping[str, int]) -> str:
    """A grammar terminal for marker ``s``: the special token by id if the tokenizer has one, else the string."""
    if s in special_tokens:
        return f"<[{int(special_tokens[s])}]>"
    return json.dumps(s)


def _grammar_error(grammar: str) -> str | None:
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    return "; ".join(messages) if is_error else None


def tool_function(tool: Any) -> dict:
    """The ``function`` of an OpenAI tool (``{"type": "function", "function": {...}}``), or a bare function."""
    if not isinstance(tool, dict):
        raise ValueError(f"a tool must be an object, got {tool!r:.80}")
    fn = tool.get("function", tool)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(f"a tool needs a function name: {tool!r:.80}")
    return fn


def select_tools(tools: Sequence[dict], tool_choice: Any) -> list[tuple[str, dict]]:
    """(name, parameters schema) of the tools ``tool_choice`` allows: all of them for "required", the named one
    for ``{"type": "function", "function": {"name": N}}``."""
    functions = [tool_function(t) for t in tools or ()]
    if not functions:
        raise ValueError("a tool-call constraint needs at least one tool")
    if tool_choice == "required":
        chosen = functions
    elif isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        chosen = [f for f in functions if f["name"] == name][:1]
        if not chosen:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools "
                             f"({', '.join(f['name'] for f in functions)})")
    else:
        raise ValueError(f"tool_choice {tool_choice!r:.60} does not force a tool call: only \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}} have a constraint")
    out = []
    for f in chosen:
        params = f.get("parameters")
        if params is None:
            params = {"type": "object"}
        if not isinstance(params, dict):
            raise ValueError(f"tool {f['name']!r}: parameters must be a JSON schema object, got {params!r:.60}")
        out.append((f["name"], params))
    return out


# ---- the parser interface -------------------------------------------------------------------------------

class ToolParser(ABC):
    """Reads one format of tool-call markup; see the module docstring for the rules every parser keeps."""

    name: ClassVar[str]
    # the call object's key for the arguments in the constraint's grammar
    arguments_key: ClassVar[str] = "arguments"

    def __init__(self, id_factory: Callable[[], str] | None = None):
        self.id_factory = id_factory or self.default_id

    @staticmethod
    def default_id() -> str:
        return make_call_id()

    def new_id(self) -> str:
        return self.id_factory()

    @abstractmethod
    def _step(self, text: str, pos: int, final: bool, after_call: bool) -> Step:
        """Classify ``text`` from ``pos`` (< len(text)); ``after_call``: the text just before ``pos`` was a call
        block. With ``final`` the answer is never None and never ends at ``pos``."""

    @abstractmethod
    def _grammar(self, call_schema: dict, single: bool, special_tokens: Mapping[str, int]) -> str:
        """The Lark grammar: one call (``single``) or one or more, each matching ``call_schema``."""

    def _steps(self, text: str, pos: int, final: bool, after_call: bool) -> Iterator[tuple[int, Text | Calls]]:
        """(start, step) from ``pos`` on, as far as the text decides."""
        while pos < len(text):
            step = self._step(text, pos, final, after_call)
            if step is None or step.end <= pos:
                if final:
                    raise AssertionError(f"{type(self).__name__}._step made no progress at {pos} of a final text")
                return
            yield pos, step
            after_call = isinstance(step, Calls)
            pos = step.end

    def extract(self, text: str) -> ExtractedToolCalls:
        """The content and the calls of a complete model output."""
        content: list[str] = []
        calls: list[ToolCall] = []
        for start, step in self._steps(text, 0, True, False):
            if isinstance(step, Text):
                content.append(text[start:step.end])
            else:
                calls.extend(ToolCall(self.new_id(), name, dump_arguments(args)) for name, args in step.calls)
        return ExtractedToolCalls("".join(content).strip() or None, calls)

    def streamer(self) -> ToolCallStream:
        return ToolCallStream(self)

    def constraint(self, tools: Sequence[dict], tool_choice: Any = "required", parallel: bool = True, *,
                   special_tokens: Mapping[str, int] | None = None) -> str:
        """A Lark grammar (llguidance dialect) forcing the output to be tool calls in this parser's format.

        ``tool_choice`` "required": one or more calls (exactly one unless ``parallel``) of any of ``tools``;
        ``{"type": "function", "function": {"name": N}}``: exactly one call of tool N. Each call's arguments match
        its tool's ``parameters`` (``{"type": "object"}`` when it has none). ``special_tokens`` maps marker
        strings (``"<tool_call>"``, ``"[TOOL_CALLS]"``) to token ids where the tokenizer has them as special tokens,
        so the grammar asks for the token rather than its spelling. Raises ValueError naming a tool whose schema
        llguidance cannot compile."""
        selected = select_tools(tools, tool_choice)
        schemas = []
        for name, params in selected:
            schema = {"type": "object", "properties": {"name": {"const": name}, self.arguments_key: params},
                      "required": ["name", self.arguments_key], "additionalProperties": False}
            error = _grammar_error("start: " + json_rule(schema))
            if error:
                raise ValueError(f"tool {name!r}: its parameters schema cannot be compiled: {error}")
            schemas.append(schema)
        call_schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        single = not parallel or isinstance(tool_choice, dict)
        grammar = self._grammar(call_schema, single, special_tokens or {})
        error = _grammar_error(grammar)
        if error:
            raise ValueError(f"the {self.name} tool-call grammar does not compile: {error}")
        return grammar


class ToolCallStream:
    """Streaming for one completion: ``feed`` each new piece of text, then ``finish`` once. Both return OpenAI
    chat-completion delta pieces (``{"content": ...}`` or ``{"tool_calls": [...]}``)."""

    def __init__(self, parser: ToolParser):
        self.parser = parser
        self.text = ""
        self.pos = 0  # the text before this is sent (or dropped)
        self.after_call = False
        self.calls_sent = 0
        self.content_started = False
        self.held_whitespace = ""
        self.finished = False

    def feed(self, delta_text: str) -> list[dict]:
        if self.finished:
            raise RuntimeError("feed() after finish()")
        self.text += delta_text
        return self._advance(final=False)

    def finish(self) -> list[dict]:
        if self.finished:
            return []
        out = self._advance(final=True)
        self.finished = True
        self.held_whitespace = ""  # trailing whitespace of the content is dropped, as extract strips it
        return out

    def _advance(self, final: bool) -> list[dict]:
        out: list[dict] = []
        for start, step in self.parser._steps(self.text, self.pos, final, self.after_call):
            if isinstance(step, Text):
                self._content(self.text[start:step.end], out)
            else:
                for name, args in step.calls:
                    i = self.calls_sent
                    self.calls_sent += 1
                    out.append({"tool_calls": [{"index": i, "id": self.parser.new_id(), "type": "function",
                                                "function": {"name": name, "arguments": ""}}]})
                    out.append({"tool_calls": [{"index": i, "function": {"arguments": dump_arguments(args)}}]})
            self.after_call = isinstance(step, Calls)
            self.pos = step.end
        return out

    def _content(self, s: str, out: list[dict]) -> None:
        if not self.content_started:
            s = s.lstrip()
            if not s:
                return
            self.content_started = True
        body = s.rstrip()
        if not body:
            self.held_whitespace += s
            return
        piece = self.held_whitespace + body
        self.held_whitespace = s[len(body):]
        if out and "content" in out[-1]:
            out[-1]["content"] += piece
        else:
            out.append({"content": piece})
