"""Token classification (named entities): words -> tags, CoNLL style.

BERT paper section 5.3 (CoNLL-2003 NER): the sentence's WordPiece tokens go
through the encoder and a linear layer per token (BertForTokenClassification);
a word's label sits on its *first* piece, the other pieces get -100 and are
ignored by the loss, and a word's prediction is read from its first piece.

Words come from the CoNLL file (one per line), so the sentence is re-joined
with single spaces and each piece is mapped to the word holding its first
character through the tokenizer's offsets (the tokenizer's own word
splitting, e.g. of "U.S.", may cut finer than CoNLL's words).

Tag schemes: BIO (IOB2, B- on every entity's first word) and IOB1 (CoNLL-2003's
own: I- everywhere, B- only between two touching entities of one type). IOB1
files are converted to IOB2 for training, as is usual, because then every
entity start has its own label; predictions are converted back for output.
Scores are conlleval's entity P/R/F1, the same for either scheme.

Long sentences (more pieces than fit): overlapping windows, each word labelled
and predicted in the window where it has the most context
(`bertkit.text.windows`).

This module trains; the features and the decoding, all that using a NER model
needs, are `bertkit.tasks.ner_inference`.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from bertkit.metrics import tasks as M
from bertkit.tasks.config import NerConfig
from bertkit.data.tables import check_known_labels, read_conll
from bertkit.tasks.registry import task_for
from bertkit.tasks.run import load_head, load_tokenizer, saver, settle, write_json, write_lines
from bertkit.tasks.batching import run_model
from bertkit.tasks.ner_inference import decode, make_features, split_cjk, to_training_tags
from bertkit.tasks.trainer import train
from bertkit.model.heads import BertForTokenClassification


def evaluate_sentences(model, tok, sentences, names, cfg: NerConfig, progress=False):
    feats, pieces = make_features(tok, sentences, None, cfg.max_length, cfg.stride)
    logits = run_model(model, feats, cfg.training.eval_batch_size, per_token=True, progress=progress,
                       desc="eval")["logits"]
    pred, empty = decode(logits, feats, pieces, names, cfg.max_length, cfg.stride)
    gold = [to_training_tags(s.tags, cfg.tag_scheme) for s in sentences]
    scores = M.entity_scores(pred, gold)
    scores["words_without_pieces"] = empty
    return scores, pred


def write_conll(path, sentences, pred, scheme: str) -> None:
    """word gold predicted, a blank line after each sentence: written whole or not at all (`write_lines`)."""

    def lines():
        for s, p in zip(sentences, pred):
            p = M.iob2_to_iob1(p) if scheme == "iob1" else p
            yield from (f"{w} {g} {t}\n" for w, g, t in zip(s.words, s.tags, p))
            yield "\n"

    write_lines(path, lines())


# what the dev scores hold beside an epoch's figures (`METRICS["ner"]` in bertkit.tasks.registry): kept in
# metrics.json's dev, not in each epoch's record (the count of words without pieces is the same every epoch)
NOT_FIGURES = ("per_type", "words_without_pieces")


def _split_cjk(sents, path, log) -> list:
    """Each CJK ideograph of a CoNLL word a word of its own (`split_cjk`), as predict splits a text, said once."""
    split = [split_cjk(s) for s in sents]
    more = sum(len(a.words) - len(b.words) for a, b in zip(split, sents))
    if more:
        log(f"{path}: words holding CJK ideographs split into one word per ideograph, as BERT's tokenizer and "
            f"predict split them ({more} more words; a word's tag continues over its later characters)")
    return split


def finetune_ner(cfg: NerConfig, log=print, speed=None) -> dict:
    settle(cfg, log)
    tcfg = cfg.training
    task_for(cfg).settle_metric(cfg)

    def read(path, limit):
        sents, report = read_conll(path, token_column=cfg.token_column, tag_column=cfg.tag_column)
        sents = sents[:limit] if limit else sents
        log(f"{report.summary()}" + (f", using the first {len(sents)}" if limit else ""))
        return _split_cjk(sents, path, log)

    train_s = read(cfg.train, cfg.max_train_examples)
    dev_s = read(cfg.dev, cfg.max_dev_examples) if cfg.dev else None
    test_s = read(cfg.test, None) if cfg.test else None  # read now: a bad --test failed only after training
    train_tags = [to_training_tags(s.tags, cfg.tag_scheme) for s in train_s]
    for s, t in zip(train_s, train_tags):  # a bad tag fails here with its line number
        M.check_tags(t, f"{cfg.train}:{s.line}")
    names = sorted({t for tags in train_tags for t in tags}, key=lambda t: (t != "O", t[2:], t[:1]))
    label2id = {n: i for i, n in enumerate(names)}
    for path, sents in ((cfg.dev, dev_s),):
        if sents:
            check_known_labels((t for s in sents for t in to_training_tags(s.tags, cfg.tag_scheme)), label2id, path)
    log(f"ner: {len(train_s)} training sentences, tags {names}")

    tok = load_tokenizer(cfg.model, cfg.max_length)
    model = load_head(BertForTokenClassification, cfg.model, tcfg.seed, log, num_labels=len(names),
                      id2label=dict(enumerate(names)), label2id=label2id)
    feats, _ = make_features(tok, train_s, label2id, cfg.max_length, cfg.stride, cfg.tag_scheme)
    if len(feats) > len(train_s):
        log(f"{len(feats) - len(train_s)} extra windows for sentences longer than max_length={cfg.max_length}")

    def evaluate(m):
        scores, pred = evaluate_sentences(m, tok, dev_s, names, cfg, tcfg.progress)
        return {k: v for k, v in scores.items() if k not in NOT_FIGURES}, (scores, pred)

    info = {"task": "ner", "max_length": cfg.max_length, "stride": cfg.stride, "tag_scheme": cfg.tag_scheme,
            "config": {k: v for k, v in asdict(cfg).items() if k != "training"}}
    out = Path(cfg.output)
    result = train(model, feats, tcfg, evaluate=evaluate if dev_s else None, save=saver(out, tok, info),
                   output_dir=out, pad_id=tok.pad_token_id, baseline=(0.0, "no entities") if dev_s else None, run_config=asdict(cfg), log=log,
                   speed=speed)
    if not result.is_main:
        return {}
    final = {"task": "ner", "train_sentences": len(train_s), "train_seconds": round(result.seconds, 1),
             "epochs": result.history, **result.saved}  # which epoch the saved model is, and why
    for split, path, sents in (("dev", cfg.dev, dev_s), ("test", cfg.test, test_s)):
        if path is None:
            continue
        if split == "dev" and result.best_predictions:
            scores, pred = result.best_predictions
        else:  # the test split, or a resumed run's best epoch from before the restart
            scores, pred = evaluate_sentences(model, tok, sents, names, cfg)  # the best epoch's weights
        final[split] = scores
        final[f"{split}_sentences"] = len(sents)
        write_conll(out / f"{split}_predictions.conll", sents, pred, cfg.tag_scheme)
    write_json(out / "metrics.json", final)
    return final
