"""The README's main job: transfer learning from a pretrained BERT in one command.

`bertkit demo` (1) writes a small labelled sentiment set that bertkit makes up
itself from templates, (2) fine-tunes the packaged pretrained model
(all-MiniLM-L6-v2) on its training part for a few epochs, (3) reports the
accuracy on the held-out part and (4) classifies a few new sentences.

The held-out part is built from *other* sentiment words and sentence frames
than the training part (e.g. it says "superb" and "dreadful", which training
never shows), so a good held-out accuracy comes from what the encoder learned
in pre-training about those words, not from memorising the training set.
That is the point of transfer learning (BERT paper, section 5).
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path


THINGS = ["movie", "restaurant", "hotel", "concert", "book", "service", "meal", "phone", "game", "trip",
          "play", "coffee"]
TRAIN_WORDS = {
    "positive": ["great", "wonderful", "excellent", "fantastic", "delightful", "enjoyable", "brilliant", "lovely"],
    "negative": ["terrible", "awful", "boring", "horrible", "disappointing", "bad", "dull", "poor"],
}
HELD_OUT_WORDS = {
    "positive": ["superb", "charming", "terrific", "pleasant", "outstanding", "marvelous"],
    "negative": ["dreadful", "miserable", "tedious", "lousy", "unpleasant", "mediocre"],
}
TRAIN_FRAMES = [
    "The {thing} was {word}.",
    "I thought the {thing} was {word}.",
    "What a {word} {thing}!",
    "Honestly, the {thing} is {word}.",
    "Our {thing} turned out {word}.",
]
HELD_OUT_FRAMES = [
    "My friends found the {thing} {word}.",
    "It was a {word} {thing}, to be honest.",
    "Everyone agreed the {thing} had been {word}.",
]
NEW_SENTENCES = [
    "An absolute gem of a film, I loved every minute of it.",
    "The food was cold and the waiter was rude.",
    "I would happily stay at this hotel again.",
    "A complete waste of money; I want a refund.",
    "The concert was sensational from start to finish.",
]


def make_examples(words: dict, frames: list, rng: random.Random, per_label: int) -> list[tuple[str, str]]:
    """`per_label` distinct sentences per label, drawn with `rng`, shuffled."""
    out = []
    for label, ws in words.items():
        pool = [f.format(thing=t, word=w) for f in frames for t in THINGS for w in ws]
        pool = [s[0].upper() + s[1:] for s in pool]
        out += [(s, label) for s in rng.sample(pool, min(per_label, len(pool)))]
    rng.shuffle(out)
    return out


def write_tsv(path: Path, rows) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("sentence\tlabel\n")
        for text, label in rows:
            f.write(f"{text}\t{label}\n")


def run_demo(output="bertkit-demo", *, model=None, epochs=None, seed: int = 0, progress: bool = True,
             train_per_label: int = 80, heldout_per_label: int = 50, log=print, speed=None) -> dict:
    """Write the data, fine-tune, evaluate, classify; returns the final metrics (`speed`: the fast
    path's settings, None: `decide()`'s)."""
    from bertkit.tasks.classification import finetune_text
    from bertkit.tasks.predict import predict
    from bertkit.tasks.config import TextTaskConfig, TrainConfig

    # a higher rate than BERT-base's 2e-5..5e-5: a small model and a few dozen updates; checked before anything
    # is written (`--epochs 0` ran the default 3 epochs)
    training = TrainConfig(epochs=3.0 if epochs is None else epochs, batch_size=16, seed=seed, metric="accuracy",
                           progress=progress)
    training.optim.learning_rate = 1e-4  # its own OptimConfig: the one setting the demo changes there
    training.validate()
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    previous = out / "model"
    if (out / "heldout.tsv").is_file() and (previous / "metrics.jsonl").is_file():
        # an earlier demo's model: running the demo again means running it again, not resuming
        shutil.rmtree(previous)
        log(f"0. removed the previous demo's model in {previous}/")
    rng = random.Random(seed)
    train_rows = make_examples(TRAIN_WORDS, TRAIN_FRAMES, rng, train_per_label)
    held_rows = make_examples(HELD_OUT_WORDS, HELD_OUT_FRAMES, rng, heldout_per_label)
    write_tsv(out / "train.tsv", train_rows)
    write_tsv(out / "heldout.tsv", held_rows)
    log(f"1. wrote {len(train_rows)} training and {len(held_rows)} held-out sentences to {out}/ "
        f"(held-out uses other words, e.g. {HELD_OUT_WORDS['positive'][0]!r}, {HELD_OUT_WORDS['negative'][0]!r})")
    for text, label in train_rows[:3]:
        log(f"     {label:>8}  {text}")

    t0 = time.perf_counter()
    log("2. fine-tuning the pretrained model (all-MiniLM-L6-v2 unless --model) ...")
    cfg = TextTaskConfig(train=str(out / "train.tsv"), dev=str(out / "heldout.tsv"), output=str(out / "model"),
                         model=model, max_length=64, training=training)
    final = finetune_text(cfg, log=lambda msg: None, speed=speed)
    secs = time.perf_counter() - t0
    acc = final["dev"]["accuracy"]
    log(f"3. held-out accuracy: {acc:.1%} on {final['dev_examples']} sentences "
        f"(chance: 50%), after {secs:.0f} s; model saved to {out / 'model'}")
    for epoch in final["epochs"]:
        log(f"     epoch {epoch['epoch']}: train loss {epoch['train_loss']:.3f}, held-out accuracy "
            f"{epoch['accuracy']:.1%}, held-out loss {epoch['held_out_loss']:.3f}")
    log(f"     kept epoch {final['saved']['epoch']}: {final['saved']['because']}")

    log("4. classifying new sentences:")
    preds = predict(out / "model", NEW_SENTENCES, fast=True if speed is None else speed)
    for text, p in zip(NEW_SENTENCES, preds):
        log(f"     {p['label']:>8} ({p['probabilities'][p['label']]:.0%})  {text}")
    final["new_sentences"] = [{"text": t, **p} for t, p in zip(NEW_SENTENCES, preds)]
    return final
