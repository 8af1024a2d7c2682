"""Train the embedded default model (and its draft model) of jaxinfer on the Python standard library.

    .venv/bin/python checkpoints/train.py --model all

writes ``jaxinfer/embedded_models/default/`` and ``jaxinfer/embedded_models/draft/`` (``--out``: another
directory to write ``default/`` and ``draft/`` into) as Hugging Face Llama checkpoints
(``config.json``, ``generation_config.json``, float32 ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``) plus ``training_summary.json``. Seeded: the same machine, Python and library
versions give the same weights. ``--steps N`` shortens a run for a smoke test; ``--set FIELD=VALUE``
overrides any ``TrainSpec`` field for an experiment (e.g. ``--set random_fraction=0.4``).

Each model is trained with AdamW (linear warmup, cosine decay) on windows of the stdlib token stream, a
share of them carrying verbatim repeats so the model learns to copy. Copying needs an induction circuit,
which a plain language-modelling loss would grow only after far more tokens than a CPU budget allows, so
two auxiliary terms steer it (``attention_supervision``): a previous-token head and induction heads are
told where to attend, and next-token positions that continue an earlier match weigh more. The first
``copy_warmup_steps`` (150) train on repeated random token strings only; afterwards a quarter of the rows
stay such strings, so the copy circuit keeps a clean training signal while the rest learns Python. The
default model trains three cycles of 3000 steps (~45 minutes each on 2 CPU cores; the later ones restart
AdamW at a quarter of the peak learning rate), the draft one cycle of 1800 (~7 minutes). At the end the
script reports the validation loss and how accurately the model, decoding greedily, copies a passage it
has just seen.

``--resume`` continues from the checkpoint in ``--out`` after its finished cycles (same recipe and seed,
checked); the data stream is replayed, so the result is bit-identical to an uninterrupted run:

    .venv/bin/python checkpoints/train.py --model default --set cycles=1   # cycle 1
    .venv/bin/python checkpoints/train.py --model default --resume         # cycles 2-3
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import stdlib_corpus as corpus
from attention_supervision import induction_loss, induction_targets, previous_token_loss
from safetensors.numpy import load_file, save_file
from tiny_llama import TinyLlamaConfig, forward, forward_with_attention, init_params, param_shapes

VOCAB_SIZE = 4096
MAX_POSITIONS = 1024


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """One model to train: its shapes and its optimisation schedule."""

    model: TinyLlamaConfig
    steps: int
    peak_lr: float
    warmup_steps: int = 100
    batch_size: int = 8
    seq_len: int = 256
    long_every: int = 4  # every n-th step trains on batch_size // 2 windows of 2 * seq_len tokens
    repeat_fraction: float = 0.7
    copy_warmup_steps: int = 150  # the first steps train on repeated random strings only
    random_fraction: float = 0.25  # share of repeated random strings after the warm-up
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    # ((layer, head), offset): heads steered to attend to position t - offset.
    previous_token_heads: tuple[tuple[tuple[int, int], int], ...] = (((0, 0), 1),)
    # (layer, head)s steered to attend right after earlier matches of the current context. Each head
    # copies a head_dim-wide projection of the token, so use heads of different kv groups.
    induction_heads: tuple[tuple[int, int], ...] = ((1, 0),)
    induction_max_match: int = 3
    attention_loss_weight: float = 0.5
    copy_token_weight: float = 3.0  # next-token loss weight where the context continues an earlier match
    # Training runs ``cycles`` cycles of ``steps`` steps; each starts a fresh AdamW (new warmup and cosine
    # decay, peak ``peak_lr * restart_lr_ratio`` after the first) from the previous cycle's weights, so a
    # run can be resumed exactly from a saved checkpoint at a cycle boundary (``--resume``).
    cycles: int = 1
    restart_lr_ratio: float = 0.25


SPECS = {
    "default": TrainSpec(
        model=TinyLlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=768,
                              num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
                              max_position_embeddings=MAX_POSITIONS),
        steps=3000, cycles=3, peak_lr=2e-3, batch_size=8, seq_len=256,
        induction_heads=((1, 0), (1, 2), (1, 4))),
    "draft": TrainSpec(
        model=TinyLlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=384,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=MAX_POSITIONS),
        steps=1800, peak_lr=3e-3, batch_size=8, seq_len=256,
        induction_heads=((1, 0), (1, 2))),
}


def cross_entropy(params, cfg: TinyLlamaConfig, batch_BT1: jax.Array) -> jax.Array:
    """Mean next-token loss of ``batch[:, 1:]`` given ``batch[:, :-1]``."""
    return jnp.mean(_next_token_losses(forward(params, cfg, batch_BT1[:, :-1]), batch_BT1))


def _next_token_losses(logits_BTV: jax.Array, batch_BT1: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, batch_BT1[:, 1:, None], axis=-1)[..., 0]


def training_loss(params, spec: TrainSpec, batch_BT1: jax.Array):
    """Weighted next-token loss plus the attention-steering losses; returns (total, (lm, steer)).

    ``lm`` is the plain mean next-token loss (what is reported); the optimised next-token term weighs
    positions whose context repeats an earlier match by ``copy_token_weight``.
    """
    inputs_BT = batch_BT1[:, :-1]
    prev_heads = tuple(head for head, _ in spec.previous_token_heads)
    logits, probs = forward_with_attention(params, spec.model, inputs_BT, prev_heads + spec.induction_heads)
    losses_BT = _next_token_losses(logits, batch_BT1)
    target_BTS, copy_mask_BT = induction_targets(inputs_BT, spec.induction_max_match)
    weights_BT = 1.0 + (spec.copy_token_weight - 1.0) * copy_mask_BT
    weighted_lm = jnp.sum(losses_BT * weights_BT) / jnp.sum(weights_BT)
    steer = sum(previous_token_loss(p, offset) for (_, offset), p in zip(spec.previous_token_heads, probs))
    for ind_probs in probs[len(prev_heads) :]:
        steer = steer + induction_loss(ind_probs, target_BTS, copy_mask_BT)
    return weighted_lm + spec.attention_loss_weight * steer, (jnp.mean(losses_BT), steer)


def make_optimizer(spec: TrainSpec, steps: int, cycle: int = 0) -> optax.GradientTransformation:
    """AdamW with a linear warmup and cosine decay over one cycle of ``steps`` steps."""
    warmup = min(spec.warmup_steps, max(1, steps // 10))
    peak = spec.peak_lr * (spec.restart_lr_ratio if cycle else 1.0)
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=warmup,
        decay_steps=steps, end_value=peak * spec.min_lr_ratio)
    decay_mask = lambda params: {k: v.ndim >= 2 for k, v in params.items()}  # no decay on norms
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=spec.weight_decay, mask=decay_mask))


def make_train_step(spec: TrainSpec, optimizer: optax.GradientTransformation):
    @partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, batch_BT1):
        (_, (lm, steer)), grads = jax.value_and_grad(training_loss, has_aux=True)(params, spec, batch_BT1)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, lm, steer

    return train_step


def mean_loss(params, cfg: TinyLlamaConfig, batches: list[np.ndarray]) -> float:
    loss_fn = jax.jit(partial(cross_entropy, cfg=cfg))
    return float(np.mean([float(loss_fn(params, batch_BT1=jnp.asarray(b))) for b in batches]))


def greedy_copy_accuracy(params, cfg: TinyLlamaConfig, passages_BP: np.ndarray, cue: int) -> float:
    """Prompt ``passage + passage[:cue]``, decode greedily, score the rest of the copy position-wise.

    No KV cache: each step runs the whole fixed-size buffer (causal, so later padding cannot leak in)
    and reads the logits at the last filled position; one compilation serves every step.
    """
    b, p = passages_BP.shape
    buf_BL = np.zeros((b, 2 * p), dtype=np.int32)
    buf_BL[:, :p] = passages_BP
    buf_BL[:, p : p + cue] = passages_BP[:, :cue]
    next_token = jax.jit(lambda prm, toks, pos: jnp.argmax(forward(prm, cfg, toks)[:, pos], axis=-1))
    for pos in range(p + cue, 2 * p):
        buf_BL[:, pos] = np.asarray(next_token(params, jnp.asarray(buf_BL), pos - 1))
    return float(np.mean(buf_BL[:, p + cue :] == passages_BP[:, cue:]))


def teacher_forced_copy_accuracy(params, cfg: TinyLlamaConfig, passages_BP: np.ndarray) -> float:
    """On ``passage + passage``, how often the argmax after second-copy token ``i`` is token ``i + 1``."""
    p = passages_BP.shape[1]
    doubled = jnp.asarray(np.concatenate([passages_BP, passages_BP], axis=1))
    logits = jax.jit(forward, static_argnums=1)(params, cfg, doubled)
    predicted = np.asarray(jnp.argmax(logits[:, p:-1], axis=-1))
    return float(np.mean(predicted == passages_BP[:, 1:]))


def copy_passages(stream: np.ndarray, count: int, length: int, eot: int, rng) -> np.ndarray:
    """``count`` windows of ``length`` tokens from the stream that contain no end-of-text token."""
    rows = []
    while len(rows) < count:
        s = int(rng.integers(0, len(stream) - length))
        window = stream[s : s + length]
        if not np.any(window == eot):
            rows.append(window)
    return np.stack(rows)


def save_checkpoint(out_dir: Path, params, cfg: TinyLlamaConfig, tok, eot: int, summary: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {name: np.asarray(value, dtype=np.float32) for name, value in sorted(params.items())}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "model.safetensors").chmod(0o644)
    (out_dir / "config.json").write_text(json.dumps(cfg.hf_config(eot, eot), indent=2) + "\n")
    generation = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    corpus.save_tokenizer(tok, out_dir, cfg.max_position_embeddings)
    (out_dir / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def train_one(name: str, spec: TrainSpec, steps: int, data: dict, out_dir: Path, seed: int,
              resume: bool = False) -> dict:
    """Train one model, evaluate it, save it under ``out_dir / name``; returns its summary.

    ``resume`` starts from the checkpoint already in ``out_dir / name`` if it holds completed cycles of this
    very recipe: the data stream is replayed up to that point, so the result equals an uninterrupted run.
    """
    if spec.cycles < 1 or steps < 1:
        raise SystemExit(f"[{name}] cycles and steps must be >= 1, got {spec.cycles} and {steps}")
    cfg = spec.model
    rng = np.random.default_rng(seed)
    params = init_params(cfg, jax.random.PRNGKey(seed))
    n_params = sum(int(np.prod(v.shape)) for v in params.values())
    done_cycles, earlier_seconds = 0, 0.0
    if resume:
        params, done_cycles, earlier_seconds = load_for_resume(out_dir / name, spec, steps, seed, data)
        for step in range(1, done_cycles * steps + 1):
            sample_batch(data["train"], spec, step, rng)  # the batches the finished cycles consumed
    print(f"[{name}] {n_params:,} parameters, {spec.cycles} cycle(s) of {steps} steps of "
          f"{spec.batch_size}x{spec.seq_len} tokens" + (f", resuming after cycle {done_cycles}" if resume else ""))

    probe = copy_passages(data["val"], 8, 64, data["eot"], np.random.default_rng(99))
    start = time.perf_counter()
    for cycle in range(done_cycles, spec.cycles):
        optimizer = make_optimizer(spec, steps, cycle)
        opt_state = optimizer.init(params)
        train_step = make_train_step(spec, optimizer)
        recent, recent_steer = [], []
        for step in range(cycle * steps + 1, (cycle + 1) * steps + 1):
            batch = sample_batch(data["train"], spec, step, rng)
            params, opt_state, loss, steer = train_step(params, opt_state, jnp.asarray(batch))
            recent.append(loss)
            recent_steer.append(steer)
            if step % 50 == 0 or step == (cycle + 1) * steps:
                train_loss = float(np.mean([float(x) for x in recent]))
                attention_loss = float(np.mean([float(x) for x in recent_steer]))
                recent, recent_steer = [], []
                print(f"[{name}] step {step:5d}  train loss {train_loss:.4f}  attention loss {attention_loss:.3f}  "
                      f"copy acc (teacher-forced) {teacher_forced_copy_accuracy(params, cfg, probe):.3f}  "
                      f"{time.perf_counter() - start:7.1f}s", flush=True)
    train_seconds = earlier_seconds + time.perf_counter() - start

    summary = {
        "model": name,
        "parameters": n_params,
        "steps": steps * spec.cycles,
        "tokens_seen": steps * spec.cycles * spec.batch_size * spec.seq_len,
        "train_wall_seconds": round(train_seconds, 1),
        "resumed_after_cycle": done_cycles if resume else None,
        "final_train_loss": train_loss,
        "final_attention_loss": attention_loss,
        **evaluate(params, spec, data),
        "spec": {k: v for k, v in dataclasses.asdict(spec).items() if k != "model"},
        "seed": seed,
        "corpus": data["corpus_description"],
        "jax_version": jax.__version__,
    }
    save_checkpoint(out_dir / name, params, cfg, data["tokenizer"], data["eot"], summary)
    print(f"[{name}] final train loss {train_loss:.4f}  val loss {summary['val_loss']:.4f}  "
          f"greedy copy accuracy {summary['greedy_copy_accuracy']:.3f}  wall {train_seconds:.0f}s  "
          f"-> {out_dir / name}")
    return summary


_CYCLE_FIELDS = ("steps", "cycles", "restart_lr_ratio")  # may differ between a saved run and its resumption


def load_for_resume(model_dir: Path, spec: TrainSpec, steps: int, seed: int, data: dict):
    """The saved weights, the number of finished cycles and their wall seconds; refuses any mismatch."""
    if not (model_dir / "training_summary.json").is_file():
        raise SystemExit(f"--resume: no training_summary.json in {model_dir}: nothing to resume")
    saved = json.loads((model_dir / "training_summary.json").read_text())
    wanted = {k: v for k, v in dataclasses.asdict(spec).items() if k != "model" and k not in _CYCLE_FIELDS}
    had = {k: saved["spec"].get(k) for k in wanted}
    if json.loads(json.dumps(wanted)) != had or saved["seed"] != seed:
        raise SystemExit(f"--resume: {model_dir} was trained with another recipe or seed")
    done_cycles, rest = divmod(saved["steps"], steps)
    if rest or not 0 < done_cycles < spec.cycles:
        raise SystemExit(f"--resume: {model_dir} holds {saved['steps']} steps, not 1..{spec.cycles - 1} "
                         f"cycles of {steps}")
    saved_vocab = json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    if saved_vocab != data["tokenizer"].get_vocab():
        raise SystemExit(f"--resume: {model_dir}'s tokenizer differs from the one trained now")
    tensors = load_file(str(model_dir / "model.safetensors"))
    expected = param_shapes(spec.model)
    if {k: v.shape for k, v in tensors.items()} != {k: tuple(v) for k, v in expected.items()}:
        raise SystemExit(f"--resume: {model_dir}'s tensors do not match the model's shapes")
    params = {k: jnp.asarray(v) for k, v in tensors.items()}
    return params, done_cycles, float(saved["train_wall_seconds"])


def evaluate(params, spec: TrainSpec, data: dict) -> dict:
    """Validation loss on natural windows (no spliced repeats) and copy accuracy on held-out passages."""
    rng = np.random.default_rng(1234)  # the same evaluation data for every model
    val_batches = [corpus.sample_batch(data["val"], 16, spec.seq_len, 0.0, rng) for _ in range(4)]
    passages = copy_passages(data["val"], 16, 64, data["eot"], rng)
    return {
        "val_loss": mean_loss(params, spec.model, val_batches),
        "greedy_copy_accuracy": greedy_copy_accuracy(params, spec.model, passages, cue=4),
        "teacher_forced_copy_accuracy": teacher_forced_copy_accuracy(params, spec.model, passages),
    }


def sample_batch(stream: np.ndarray, spec: TrainSpec, step: int, rng) -> np.ndarray:
    """The step's rows: ``batch_size x seq_len``, or half as many twice as long every ``long_every``.

    During the copy warm-up every row is a repeated random string: with no language statistics to
    learn, the induction circuit forms within a couple of hundred steps, and then survives the switch to
    real text (where it would otherwise need far longer to emerge).
    """
    random_fraction = 1.0 if step <= spec.copy_warmup_steps else spec.random_fraction
    batch, length = spec.batch_size, spec.seq_len
    if spec.long_every and step % spec.long_every == 0:
        batch, length = batch // 2, 2 * length
    return corpus.sample_batch(stream, batch, length, spec.repeat_fraction, rng,
                               random_fraction=random_fraction, vocab_size=spec.model.vocab_size)


def prepare_data(val_fraction: float = 0.05) -> dict:
    files = corpus.stdlib_files()
    documents = corpus.read_documents(files)
    tok = corpus.train_tokenizer(documents, VOCAB_SIZE)
    stream = corpus.encode_stream(tok, documents)
    train, val = corpus.split_stream(stream, val_fraction)
    n_bytes = sum(len(d.encode("utf-8")) for d in documents)
    description = (f"{len(files)} top-level *.py files of the Python stdlib ({files[0].parent}), "
                   f"{n_bytes:,} bytes, {len(stream):,} tokens ({len(train):,} train / {len(val):,} val)")
    print(description)
    return {"tokenizer": tok, "eot": tok.token_to_id(corpus.END_OF_TEXT), "train": train, "val": val,
            "corpus_description": description}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["default", "draft", "all"], default="all")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "jaxinfer" / "embedded_models")
    parser.add_argument("--steps", type=int, default=None, help="override the number of steps (smoke tests)")
    parser.add_argument("--batch-size", type=int, default=None, help="override sequences per step")
    parser.add_argument("--seq-len", type=int, default=None, help="override tokens per sequence")
    parser.add_argument("--repeat-fraction", type=float, default=None, help="override the copy share")
    parser.add_argument("--copy-weight", type=float, default=None, help="override copy_token_weight")
    parser.add_argument("--copy-warmup", type=int, default=None, help="override copy_warmup_steps")
    parser.add_argument("--lr", type=float, default=None, help="override the peak learning rate")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override any TrainSpec field, VALUE a Python literal (experiments)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true",
                        help="continue from the finished cycles of the checkpoint already in --out")
    args = parser.parse_args()

    jax.config.update("jax_default_matmul_precision", "highest")
    data = prepare_data()
    names = ["default", "draft"] if args.model == "all" else [args.model]
    for name in names:
        spec = SPECS[name]
        if args.batch_size:
            spec = dataclasses.replace(spec, batch_size=args.batch_size)
        if args.repeat_fraction is not None:
            spec = dataclasses.replace(spec, repeat_fraction=args.repeat_fraction)
        if args.copy_weight is not None:
            spec = dataclasses.replace(spec, copy_token_weight=args.copy_weight)
        if args.copy_warmup is not None:
            spec = dataclasses.replace(spec, copy_warmup_steps=args.copy_warmup)
        if args.lr:
            spec = dataclasses.replace(spec, peak_lr=args.lr)
        if args.seq_len:
            spec = dataclasses.replace(spec, seq_len=args.seq_len)
        for item in args.set:
            field, value = item.split("=", 1)
            spec = dataclasses.replace(spec, **{field: ast.literal_eval(value)})
        train_one(name, spec, args.steps or spec.steps, data, args.out, args.seed, args.resume)


if __name__ == "__main__":
    main()
