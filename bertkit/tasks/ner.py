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
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bertkit.errors import BertkitError
from bertkit.metrics import tasks as M
from bertkit.tasks.config import NerConfig
from bertkit.data.tables import TaggedSentence, check_known_labels, read_conll
from bertkit.tasks.run import load_head, load_tokenizer, saver, write_json
from bertkit.tasks.trainer import IGNORE_INDEX, run_model, train
from bertkit.text.windows import max_context_owner, spans
from bertkit.model.heads import BertForTokenClassification


@dataclass
class WordPieces:
    """A sentence's pieces: ids, the word each piece belongs to, each word's first piece."""

    ids: list[int]
    piece_word: list[int]
    first_piece: list[int | None]  # per word; None when the word produced no piece


def word_pieces(tok, words: list[str]) -> WordPieces:
    text = " ".join(words)
    starts, pos = [], 0
    for w in words:
        starts.append(pos)
        pos += len(w) + 1
    enc = tok.encode(text, add_special_tokens=False, truncation=False)
    piece_word = [bisect.bisect_right(starts, s) - 1 for s, _ in enc.offsets]
    first: list[int | None] = [None] * len(words)
    for p, w in enumerate(piece_word):
        if first[w] is None:
            first[w] = p
    return WordPieces(list(enc.input_ids), piece_word, first)


def to_training_tags(tags: list[str], scheme: str) -> list[str]:
    return M.iob1_to_iob2(tags) if scheme == "iob1" else list(tags)


def make_features(tok, sentences: list[TaggedSentence], label2id: dict | None, max_length: int, stride: int,
                  scheme: str = "bio"):
    """(features, pieces per sentence): one feature per window, labels on first pieces."""
    feats, all_pieces = [], []
    size = max_length - 2
    for i, sent in enumerate(sentences):
        wp = word_pieces(tok, sent.words)
        all_pieces.append(wp)
        windows = spans(len(wp.ids), size, stride)
        labels = None
        if label2id is not None and sent.tags is not None:
            tags = to_training_tags(sent.tags, scheme)
            labels = [IGNORE_INDEX] * len(wp.ids)
            for w, p in enumerate(wp.first_piece):
                if p is not None:
                    labels[p] = label2id[tags[w]]
        owner = max_context_owner(windows, len(wp.ids))
        for k, (s, e) in enumerate(windows):
            f = {"input_ids": [tok.cls_token_id, *wp.ids[s:e], tok.sep_token_id],
                 "token_type_ids": [0] * (e - s + 2), "example_index": i, "window_start": s, "window": k}
            if labels is not None:
                # a word is trained once, in its max-context window
                f["labels"] = [IGNORE_INDEX] + [labels[p] if owner[p] == k else IGNORE_INDEX
                                                for p in range(s, e)] + [IGNORE_INDEX]
            feats.append(f)
    return feats, all_pieces


def decode(logits: list[np.ndarray], feats: list[dict], pieces: list[WordPieces], names: list[str],
           max_length: int, stride: int) -> tuple[list[list[str]], int]:
    """IOB2 tags per word from per-token logits; also how many words had no piece (tagged O)."""
    by_example: dict[int, dict[int, np.ndarray]] = {}
    for v, f in zip(logits, feats):
        by_example.setdefault(f["example_index"], {})[f["window"]] = v
    out, empty = [], 0
    for i, wp in enumerate(pieces):
        windows = spans(len(wp.ids), max_length - 2, stride)
        owner = max_context_owner(windows, len(wp.ids))
        tags = []
        for p in wp.first_piece:
            if p is None:
                tags.append("O")
                empty += 1
                continue
            k = owner[p]
            row = by_example[i][k][1 + p - windows[k][0]]
            tags.append(names[int(row.argmax())])
        out.append(tags)
    return out, empty


def predict_words(model, tok, sentences: list[list[str]], info: dict, batch_size: int = 32) -> list[list[str]]:
    """Tags for whitespace-split sentences, in the scheme the model was trained with."""
    sents = [TaggedSentence(list(s), None) for s in sentences]
    ml, st = info.get("max_length", 128), info.get("stride", 32)
    feats, pieces = make_features(tok, sents, None, ml, st)
    logits = run_model(model, feats, batch_size, per_token=True)["logits"]
    tags, _ = decode(logits, feats, pieces, model.config.labels, ml, st)
    if info.get("tag_scheme") == "iob1":
        tags = [M.iob2_to_iob1(t) for t in tags]
    return tags


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
    with open(path, "w", encoding="utf-8") as f:
        for s, p in zip(sentences, pred):
            p = M.iob2_to_iob1(p) if scheme == "iob1" else p
            for w, g, t in zip(s.words, s.tags, p):
                f.write(f"{w} {g} {t}\n")
            f.write("\n")


def finetune_ner(cfg: NerConfig, log=print) -> dict:
    cfg.validate()
    tcfg = cfg.training
    tcfg.metric = tcfg.metric or "f1"

    def read(path, limit):
        sents, report = read_conll(path, token_column=cfg.token_column, tag_column=cfg.tag_column)
        sents = sents[:limit] if limit else sents
        log(f"{report.summary()}" + (f", using the first {len(sents)}" if limit else ""))
        return sents

    train_s = read(cfg.train, cfg.max_train_examples)
    dev_s = read(cfg.dev, cfg.max_dev_examples) if cfg.dev else None
    train_tags = [to_training_tags(s.tags, cfg.tag_scheme) for s in train_s]
    for s, t in zip(train_s, train_tags):  # a bad tag fails here with its line number
        try:
            M.get_entities(t)
        except BertkitError as err:
            raise BertkitError(f"{cfg.train}:{s.line}: {err}") from None
    names = sorted({t for tags in train_tags for t in tags}, key=lambda t: (t != "O", t[2:], t[:1]))
    label2id = {n: i for i, n in enumerate(names)}
    for path, sents in ((cfg.dev, dev_s),):
        if sents:
            check_known_labels((t for s in sents for t in to_training_tags(s.tags, cfg.tag_scheme)), label2id, path)
    log(f"ner: {len(train_s)} training sentences, tags {names}")

    tok = load_tokenizer(cfg.model)
    model = load_head(BertForTokenClassification, cfg.model, tcfg.seed, log, num_labels=len(names),
                      id2label=dict(enumerate(names)), label2id=label2id)
    feats, _ = make_features(tok, train_s, label2id, cfg.max_length, cfg.stride, cfg.tag_scheme)
    if len(feats) > len(train_s):
        log(f"{len(feats) - len(train_s)} extra windows for sentences longer than max_length={cfg.max_length}")

    def evaluate(m):
        scores, pred = evaluate_sentences(m, tok, dev_s, names, cfg, tcfg.progress)
        return {k: v for k, v in scores.items() if k != "per_type"}, (scores, pred)

    info = {"task": "ner", "max_length": cfg.max_length, "stride": cfg.stride, "tag_scheme": cfg.tag_scheme,
            "config": {k: v for k, v in asdict(cfg).items() if k != "training"}}
    out = Path(cfg.output)
    result = train(model, feats, tcfg, evaluate=evaluate if dev_s else None, save=saver(out, tok, info),
                   output_dir=out, pad_id=tok.pad_token_id, baseline=(0.0, "no entities") if dev_s else None, run_config=asdict(cfg), log=log)
    if not result.is_main:
        return {}
    final = {"task": "ner", "train_sentences": len(train_s), "train_seconds": round(result.seconds, 1),
             "epochs": result.history}
    for split, path, sents in (("dev", cfg.dev, dev_s), ("test", cfg.test, None)):
        if path is None:
            continue
        sents = sents if sents is not None else read(path, None)
        if split == "dev" and result.best_predictions:
            scores, pred = result.best_predictions
        else:  # the test split, or a resumed run's best epoch from before the restart
            scores, pred = evaluate_sentences(model, tok, sents, names, cfg)  # the best epoch's weights
        final[split] = scores
        final[f"{split}_sentences"] = len(sents)
        write_conll(out / f"{split}_predictions.conll", sents, pred, cfg.tag_scheme)
    write_json(out / "metrics.json", final)
    return final


def format_ner_report(final: dict) -> str:
    lines = []
    for split in ("dev", "test"):
        if split not in final:
            continue
        s = final[split]
        lines.append(f"{split} ({final[split + '_sentences']} sentences): entity precision {s['precision']:.4f}, "
                     f"recall {s['recall']:.4f}, F1 {s['f1']:.4f}")
        for typ, r in s["per_type"].items():
            lines.append(f"  {typ:>8}: precision {r['precision']:.3f} recall {r['recall']:.3f} f1 {r['f1']:.3f} "
                         f"({r['support']} entities)")
    return "\n".join(lines) or f"trained on {final['train_sentences']} sentences (no dev set)"
