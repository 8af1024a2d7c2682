"""A Qwen-sized (~150,000-token) byte-level BPE tokenizer, trained here on generated text.

Why: a grammar backend's per-token mask cost grows with the vocabulary (every step walks a token trie), so
numbers measured on the embedded 4,096-token tokenizer say little about a production model. No 150k
tokenizer ships with the repository and the bench machines have no network, so one is trained here with the
``tokenizers`` library and cached to a path the caller chooses (outside the repository).

How it is built:

* the pre-tokenizer is shaped like Qwen2's: a ``Split`` on Qwen2's regex (contractions, runs of letters with
  one optional leading non-letter, single digits, punctuation runs with an optional leading space, newlines,
  other whitespace), then ``ByteLevel`` without its own regex; the decoder is ``ByteLevel``. So digits are
  single tokens and punctuation runs such as ``{"``, ``":"`` and ``"},`` become tokens, as in Qwen;
* the model is ``BPE`` trained by ``BpeTrainer(vocab_size=150000)`` with the 256 byte symbols as the initial
  alphabet and ``<|endoftext|>`` (id 0, the eos), ``<|im_start|>``, ``<|im_end|>`` as special tokens;
* the corpus is generated deterministically (``random.Random(seed)``): prose from a lexicon of pseudo-English
  words (syllable combinations, a few hundred thousand distinct ones, Zipf-distributed, plus common real
  words), JSON documents (snake_case / camelCase keys, nested objects and arrays, compact and indented),
  Python-like code, numbers, dates, times and UUIDs. The lexicon is large enough that BPE finds merges for the
  whole 150k budget, so the vocabulary is made only of real merges (no padding tokens): if training stops
  early the returned size is smaller, and ``build_tokenizer`` raises unless at least ``min_vocab`` tokens
  were learned.

The token *strings* are therefore not Qwen's (they are pseudo-words), but the vocabulary size, the byte-level
alphabet, the pre-tokenization and the shape of the trie (many long word tokens sharing prefixes, many
punctuation-run tokens) are what a grammar engine meets with Qwen. Training takes about a minute on 2 cores.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # <|endoftext|> is id 0, the eos

_COMMON_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there one all we their can has been if more when will would who so no other time about "
    "into than them only some could these two may first then do any like my now over such our man me even most "
    "made after also did many before must through back years where much your way well down should because each "
    "just those people how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year off come since against "
    "go came right used take three name value type status result error message request response data user id "
    "count total price amount date time created updated description title items list index key true false null "
    "number string object array schema field required properties version config option enabled default"
).split()
_ONSETS = ("", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br", "ch",
           "cl", "cr", "dr", "fl", "fr", "gl", "gr", "pl", "pr", "qu", "sc", "sh", "sl", "sm", "sn", "sp", "st", "str",
           "th", "tr", "wh")
_NUCLEI = ("a", "e", "i", "o", "u", "y", "ai", "ea", "ee", "io", "oa", "oo", "ou", "ie")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "nt", "rd", "rs", "st", "ck", "x", "ph", "sh", "tion")


def _pseudo_word(rng: random.Random) -> str:
    n = rng.choices((1, 2, 3, 4), weights=(3, 5, 3, 1))[0]
    return "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS) for _ in range(n))


def _lexicon(rng: random.Random, size: int) -> list[str]:
    words = dict.fromkeys(_COMMON_WORDS)
    while len(words) < size:
        words.setdefault(_pseudo_word(rng))
    return list(words)


class _Text:
    """Deterministic generators of the corpus' kinds of text, drawing words from a Zipf-weighted lexicon."""

    def __init__(self, rng: random.Random, lexicon: list[str]):
        self.rng = rng
        self.lexicon = lexicon
        self.cum = []
        total = 0.0
        for rank in range(len(lexicon)):
            total += 1.0 / (rank + 10) ** 0.9
            self.cum.append(total)

    def word(self) -> str:
        return self.rng.choices(self.lexicon, cum_weights=self.cum)[0]

    def rare_word(self) -> str:  # uniform over the lexicon, so that every word is seen
        return self.rng.choice(self.lexicon)

    def sentence(self) -> str:
        words = [self.word() if self.rng.random() < 0.7 else self.rare_word() for _ in range(self.rng.randint(4, 18))]
        words[0] = words[0].capitalize()
        if self.rng.random() < 0.2:
            words.insert(self.rng.randint(1, len(words)), str(self.rng.randint(0, 10_000)))
        return " ".join(words) + self.rng.choice((".", ".", ".", "?", "!", ";", ":"))

    def paragraph(self) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(2, 6)))

    def key(self) -> str:
        parts = [self.word() for _ in range(self.rng.randint(1, 3))]
        style = self.rng.random()
        if style < 0.5:
            return "_".join(parts)
        if style < 0.8:
            return parts[0] + "".join(p.capitalize() for p in parts[1:])
        return "-".join(parts)

    def scalar(self):
        r = self.rng.random()
        if r < 0.25:
            return " ".join(self.word() for _ in range(self.rng.randint(1, 5)))
        if r < 0.45:
            return self.rng.randint(-1000, 100_000)
        if r < 0.6:
            return round(self.rng.uniform(-100, 1000), self.rng.randint(1, 4))
        if r < 0.7:
            return self.rng.random() < 0.5
        if r < 0.75:
            return None
        if r < 0.82:
            return self.date()
        if r < 0.88:
            return self.datetime()
        if r < 0.93:
            return self.uuid()
        return f"{self.word()}.{self.word()}@{self.word()}.{self.rng.choice(('com', 'org', 'net', 'io'))}"

    def value(self, depth: int):
        r = self.rng.random()
        if depth < 3 and r < 0.15:
            return self.obj(depth + 1)
        if depth < 3 and r < 0.25:
            return [self.value(depth + 1) if self.rng.random() < 0.3 else self.scalar()
                    for _ in range(self.rng.randint(0, 5))]
        return self.scalar()

    def obj(self, depth: int = 0) -> dict:
        return {self.key(): self.value(depth) for _ in range(self.rng.randint(1, 8))}

    def json_doc(self) -> str:
        doc = self.obj()
        style = self.rng.random()
        if style < 0.4:
            return json.dumps(doc)
        if style < 0.7:
            return json.dumps(doc, separators=(",", ":"))
        return json.dumps(doc, indent=self.rng.choice((2, 4)))

    def date(self) -> str:
        return f"{self.rng.randint(1970, 2030):04d}-{self.rng.randint(1, 12):02d}-{self.rng.randint(1, 28):02d}"

    def datetime(self) -> str:
        r = self.rng
        return f"{self.date()}T{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}Z"

    def uuid(self) -> str:
        h = "%032x" % self.rng.getrandbits(128)
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def code(self) -> str:
        r = self.rng
        name = "_".join(self.word() for _ in range(r.randint(1, 3)))
        args = [self.word() for _ in range(r.randint(0, 4))]
        body = []
        for _ in range(r.randint(1, 6)):
            a, b = self.word(), self.word()
            body.append(r.choice((
                f"    {a} = {b}.{self.word()}({r.randint(0, 99)})",
                f"    if {a} is None:\n        return {b}",
                f"    for {a} in range(len({b})):\n        {b}[{a}] += {r.randint(1, 9)}",
                f"    {a}_list.append({{\"{self.key()}\": {b}}})",
                f"    # {self.sentence()}",
                f"    raise ValueError(f\"bad {a}: {{{b}!r}}\")",
            )))
        body.append(f"    return {r.choice(args) if args else 'None'}")
        return f"def {name}({', '.join(args)}):\n" + "\n".join(body) + "\n"

    def numbers(self) -> str:
        r = self.rng
        return " ".join(r.choice((str(r.randint(0, 10 ** r.randint(1, 9))), f"{r.uniform(-1e4, 1e4):.3f}",
                                  f"{r.random():.2e}", self.date(), self.uuid())) for _ in range(r.randint(3, 12)))


def generate_corpus(seed: int = 0, num_docs: int = 60_000, lexicon_size: int = 400_000):
    """Yield ``num_docs`` documents of generated text (prose, JSON, code, numbers); deterministic in ``seed``.

    The first pass yields every lexicon word once (as prose lines of 50 words) so that each word can become a
    token; the rest is mixed text with Zipf-distributed words."""
    rng = random.Random(seed)
    lexicon = _lexicon(rng, lexicon_size)
    for i in range(0, len(lexicon), 50):
        yield " ".join(lexicon[i:i + 50])
    text = _Text(rng, lexicon)
    kinds = (text.paragraph, text.json_doc, text.code, text.numbers)
    for _ in range(num_docs):
        yield rng.choices(kinds, weights=(4, 4, 2, 1))[0]()


def train_tokenizer(vocab_size: int = 150_000, seed: int = 0, num_docs: int = 60_000,
                    lexicon_size: int = 400_000) -> str:
    """Train the byte-level BPE tokenizer described in the module docstring; return its JSON string."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(generate_corpus(seed, num_docs, lexicon_size), trainer=trainer)
    return tok.to_str()


def build_tokenizer(cache_path: str | Path, vocab_size: int = 150_000, seed: int = 0,
                    min_vocab: int | None = None, verbose: bool = True) -> str:
    """The tokenizer JSON string, read from ``cache_path`` if it is there, else trained and written there.

    Raises ``RuntimeError`` if the trained vocabulary has fewer than ``min_vocab`` tokens (default: 98% of
    ``vocab_size``)."""
    path = Path(cache_path)
    if path.exists():
        return path.read_text()
    start = time.perf_counter()
    text = train_tokenizer(vocab_size=vocab_size, seed=seed)
    size = len(json.loads(text)["model"]["vocab"])
    floor = int(0.98 * vocab_size) if min_vocab is None else min_vocab
    if size < floor:
        raise RuntimeError(f"trained only {size} tokens (wanted >= {floor}); enlarge the generated corpus")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    if verbose:
        print(f"trained a {size}-token BPE tokenizer in {time.perf_counter() - start:.1f} s -> {path}")
    return text
