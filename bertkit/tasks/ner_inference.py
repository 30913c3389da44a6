"""Using a NER model: words -> features with labels on first pieces, per-token logits -> tags.

What `bertkit.tasks.ner` trains (BertForTokenClassification, BERT section 5.3,
CoNLL-2003) is read back here. A word's label sits on its *first* piece, the
other pieces get -100 (ignored by the loss), and a word's prediction is read
from its first piece. Given words are re-joined with single spaces and each piece
is mapped to the word holding its first character through the tokenizer's offsets
(the tokenizer's own splitting, e.g. of "U.S.", may cut finer than the words).

A raw text's words are the Penn Treebank's (`ptb_spans`, `text_pieces`), the tokenization CoNLL-2003 (and
every corpus tokenized like it) follows, so a model reads the words it was trained on: "Paris" and "." apart,
"(Reuters)" three words, "U.S." and "U.S.-based" one. Whitespace words tagged "Paris." whole, the period inside
the entity's span; BERT's words (each punctuation character apart) made "U.S." four, U . S ., tagged as two
entities U and S. Words given as such (a CoNLL file, a list of words) are kept as
given; only a word holding CJK ideographs is split, one word per ideograph (`split_words`), for training
and evaluation too (`split_cjk`), its tag continued over the characters after the first (B-LOC -> B-LOC
I-LOC): Chinese or Japanese text has no spaces, and a model learns the words it is asked for.

Long sentences (more pieces than fit): overlapping windows, each word labelled
and predicted in the window where it has the most context (`bertkit.text.windows`).
Tags are IOB2 inside; an IOB1 model's predictions are converted back.

No torch here: `predict` gets `run(features)`, the model run over features
(`bertkit.tasks.batching.run_model`), so using a model needs no training code.
Shapes: logits per window feature (T, num_labels).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertkit.data.tables import (Inputs, TaggedSentence, check_known_labels, conll_has_tags, looks_like_conll,
                                 read_conll, read_text_columns, read_text_lines, text_column_of)
from bertkit.metrics import tasks as M
from bertkit.model.config import IGNORE_INDEX
from bertkit.tasks.config import NerConfig
from bertkit.text.basic_tokenizer import is_cjk, is_punctuation
from bertkit.text.windows import max_context_owner, read_tokens, spans

TABLES = (".tsv", ".csv", ".jsonl", ".json")  # inputs read as a table; anything else is CoNLL or lines


@dataclass
class WordPieces:
    """A sentence's pieces: ids, the word each piece belongs to, each word's first piece."""

    ids: list[int]
    piece_word: list[int]
    first_piece: list[int | None]  # per word; None when the word produced no piece


def word_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each part of a given word (or words): split on whitespace, each CJK ideograph (the
    BasicTokenizer's ranges, `is_cjk`) a part of its own; "我爱Paris" -> 我, 爱, Paris. (A raw text's words are
    the Penn Treebank's, `ptb_spans`.)"""
    out, start = [], None
    for i, ch in enumerate(text):
        if ch.isspace() or is_cjk(ch):
            if start is not None:
                out.append((start, i))
            start = None
            if not ch.isspace():
                out.append((i, i + 1))
        elif start is None:
            start = i
    return out + ([(start, len(text))] if start is not None else [])


def split_words(text: str) -> list[str]:
    """The parts of a given word as NER reads them (`word_spans`)."""
    return [text[a:b] for a, b in word_spans(text)]


def split_cjk(sentence: TaggedSentence) -> TaggedSentence:
    """A CoNLL sentence whose words holding CJK ideographs are split as `split_words` splits a given word; the
    word's tag stays on its first part and continues over the rest (B-X or I-X -> I-X; O and a bare IO tag stay)."""
    words, tags = [], [] if sentence.tags is not None else None
    for w, word in enumerate(sentence.words):
        parts = split_words(word) or [word]
        words += parts
        if tags is not None:
            tag = sentence.tags[w]
            rest = "I-" + tag[2:] if tag[:2] in ("B-", "I-") else tag
            tags += [tag] + [rest] * (len(parts) - 1)
    return TaggedSentence(words, tags, sentence.line)


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


def ptb_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of a raw text's words, split as the Penn Treebank tokenizes: the convention of CoNLL-2003's
    tokens (Reuters text, PTB-tokenized) and of nltk's TreebankWordTokenizer (the tests' oracle). On whitespace
    and each CJK ideograph (`word_spans`), then off each part its leading and trailing punctuation (quotes,
    brackets, , ; : ! ? $ % ..., a character a word but a run of - or . one: "--", "...") and the clitics 's 're
    've 'll 'd 'm n't ("can't" -> ca n't); punctuation inside a word stays: "U.S.-based", "1,000", "O'Brien".
    A trailing period is split off ("Paris." -> Paris .) but for an abbreviation by its form, a period inside
    ("U.S.", "a.m.") or a single letter ("J."), where the text goes on (PTB splits a sentence's final period
    only, and a text may hold several sentences). BERT's own words (each punctuation character apart) made
    "U.S." four words, U . S ., that a model trained on CoNLL's whole words tags badly."""
    parts = word_spans(text)
    out = []
    for k, (a, b) in enumerate(parts):
        out += _ptb_word(text, a, b, k == len(parts) - 1)
    return out


_CLITIC = re.compile(r"(?i)(?:n't|'s|'re|'ve|'ll|'d|'m)$")  # PTB's contractions, split from their word


def _ptb_word(text: str, a: int, b: int, last: bool) -> list[tuple[int, int]]:
    """The PTB words of text[a:b], one whitespace-separated part (`ptb_spans`); `last`: it ends the text."""
    head, tail = [], []
    while a < b and is_punctuation(text[a]) and not _CLITIC.fullmatch(text, a, b) \
            and not (text[a] == "." and text[a + 1:a + 2].isdigit()):  # ".5" is a number
        e = a + 1
        while text[a] in "-." and e < b and text[e] == text[a]:
            e += 1
        head.append((a, e))
        a = e
    while b > a and is_punctuation(text[b - 1]) and not (text[b - 1] == "." and not last and _abbreviation(text[a:b])):
        s = b - 1
        while text[s] in "-." and s > a and text[s - 1] == text[s]:
            s -= 1
        tail.append((s, b))
        b = s
    clitic = _CLITIC.search(text, a, b)
    if clitic and clitic.start() > a:
        tail.append((clitic.start(), b))
        b = clitic.start()
    return head + ([(a, b)] if a < b else []) + tail[::-1]


def _abbreviation(word: str) -> bool:
    """An abbreviation by its form, its final period kept: one inside ("U.S.", "a.m.") or one letter ("J.")."""
    return word[-2:-1] != "." and ("." in word[:-1] or (len(word) == 2 and word[0].isalpha()))  # not "..."


def text_pieces(tok, text: str) -> tuple[list[str], WordPieces]:
    """A raw text's words, the Penn Treebank's (`ptb_spans`), each a slice of the text (case and accents kept),
    and their pieces; a word of characters BERT drops (a control character alone) is no word."""
    words = [text[a:b] for a, b in ptb_spans(text)]
    wp = word_pieces(tok, words)
    if None in wp.first_piece:
        words = [w for w, p in zip(words, wp.first_piece) if p is not None]
        wp = word_pieces(tok, words)
    return words, wp


def given_words(words: list[str]) -> list[str]:
    """Words given as such (a CoNLL sentence's, a list's), as the model was trained on them: each as it is, but
    for a word holding CJK ideographs or spaces, split (`split_words`)."""
    return [part for word in words for part in split_words(word)]


def to_training_tags(tags: list[str], scheme: str) -> list[str]:
    return M.iob1_to_iob2(tags) if scheme == "iob1" else list(tags)


def make_features(tok, sentences: list[TaggedSentence], label2id: dict | None, max_length: int, stride: int,
                  scheme: str = "bio", pieces: list[WordPieces] | None = None):
    """(features, pieces per sentence): one feature per window, labels on first pieces. pieces: the sentences'
    (`text_pieces` of a raw text), else those of their words (`word_pieces`)."""
    feats, all_pieces = [], []
    size = max_length - 2
    for i, sent in enumerate(sentences):
        wp = word_pieces(tok, sent.words) if pieces is None else pieces[i]
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


def training_features(tok, texts: list[str], pairs, answers: list[list[str]] | None, info: dict,
                      names: list[str]) -> list[dict]:
    """Features to train a model of this task on (layer distillation's data), encoded as it was trained
    (bertkit_task.json): each text split into words (`split_words`), with the tags of `answers` (the file's
    scheme) on first pieces where the file had them."""
    scheme = info.get("tag_scheme", "bio")
    label2id = None
    if answers is not None:
        label2id = {n: i for i, n in enumerate(names)}
        check_known_labels((t for tags in answers for t in to_training_tags(tags, scheme)), label2id, "the data")
    sentences = [TaggedSentence(split_words(t), None if answers is None else answers[i]) for i, t in enumerate(texts)]
    feats, _ = make_features(tok, sentences, label2id, *reading(info), scheme)
    return feats


def reading(info: dict) -> tuple[int, int]:
    """(max_length, stride) a model reads its sentences with: its bertkit_task.json's; a Hugging Face checkpoint
    keeps no stride, so it gets the overlap a run of its length gets (NerConfig.fit: a quarter of it, at most 32).
    The default 32 left a checkpoint of 32 positions no window, and predict refused its every input."""
    cfg = NerConfig(train="", output="", max_length=info.get("max_length", 128), stride=info.get("stride"))
    cfg.fit(None)
    return cfg.max_length, cfg.stride


def window_tokens(info: dict, pieces: int, pair: None = None, reading=reading) -> int:
    """The tokens the model reads of a text of `pieces` word pieces: [CLS] span [SEP] per window of max_length,
    the overlaps read again (`read_tokens`: from the length, no windows made). `reading`: (max_length, stride)
    from the info; a text model trained with --stride reads a single text the same way (its own reading)."""
    max_length, stride = reading(info)
    return read_tokens(pieces, max_length - 2, stride, 2)


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


def predict(run, tok, texts: list, pairs, info: dict, names: list[str]) -> list[dict]:
    """Each text's words -> {"words", "tags"}, the tags in the scheme the model was trained with: a str's words are
    the Penn Treebank's (`text_pieces`: "Paris." is Paris and ., "U.S." one word), a list's its items (`given_words`)."""
    read = [(given_words(t), None) if isinstance(t, list) else text_pieces(tok, t) for t in texts]
    sentences = [words for words, _ in read]
    pieces = [wp if wp is not None else word_pieces(tok, words) for words, wp in read]
    ml, st = reading(info)
    feats, pieces = make_features(tok, [TaggedSentence(s, None) for s in sentences], None, ml, st, pieces=pieces)
    tags, _ = decode(run(feats, per_token=True)["logits"], feats, pieces, names, ml, st)
    if info.get("tag_scheme") == "iob1":
        tags = [M.iob2_to_iob1(t) for t in tags]
    return [{"words": w, "tags": t} for w, t in zip(sentences, tags)]


def answered_tags(names: list[str] | None, info: dict) -> list[str] | None:
    """The tags `predict` answers with: the label names, and under --tag-scheme iob1 each B-X's I-X too (IOB1
    starts an entity with I-, `iob2_to_iob1`): a file whose X entities are all single words trains B-X alone, and
    the names alone lacked the I-X its every answer holds."""
    if info.get("tag_scheme") != "iob1" or not names:
        return names
    out = list(names)
    for name in names:
        if name.startswith("B-") and "I-" + name[2:] not in out:
            out.append("I-" + name[2:])
    return out


def score_answers(preds: list[dict], gold: list[list[str]], info: dict, names=None) -> dict:
    """conlleval's entity precision, recall and F1 against the file's tags (an IO model's bare "PER" read as
    I-PER, `predicted_tags`)."""
    return M.entity_scores([M.predicted_tags(p["tags"]) for p in preds], gold)


# --- files -----------------------------------------------------------------

def read_inputs(path, info: dict, text_column=None, text_pair_column=None, log=print, *,
                keep_rows: bool = False) -> Inputs:
    """Sentences from CoNLL columns (the words' column the model was trained on), one sentence per line, or a
    table's text column (with `keep_rows` its rows): the one named, else 'sentence', 'text' or its one column of
    text, as the text tasks read a table (`text_column_of`; 'sentence' alone refused a table of 'id' and 'text'). A
    line or a table's cell is raw text, its words the Penn Treebank's (`text_pieces`); a CoNLL sentence's words and a JSON
    list's are kept as given (`Inputs.words`)."""
    if Path(path).suffix.lower() in TABLES:
        return read_text_columns(path, text_column_of(path, text_column or info.get("text_column"), (), log), log=log,
                                 keep_rows=keep_rows)
    if looks_like_conll(path):  # one token per line, blank lines between sentences: its words, as given
        sentences, _ = read_conll(path, token_column=conll_columns(info)[0], tagged=False)
        return Inputs([" ".join(s.words) for s in sentences], words=[s.words for s in sentences])
    return Inputs(read_text_lines(path))  # one sentence per line: raw text, its words BERT's


def read_labelled(path, info: dict, text_column=None, text_pair_column=None, label_column=None, *,
                  every_input: bool = False, keep_rows: bool = False, log=print) -> Inputs | None:
    """The sentences of a CoNLL file with a tag column and their gold tags in the file's scheme, else None, or with
    `every_input` its inputs all the same (`read_inputs`, answers None; `keep_rows`: a table's rows). A tagged file
    tags every word."""
    if Path(path).suffix.lower() in TABLES or not conll_has_tags(path):
        return read_inputs(path, info, text_column, text_pair_column, log, keep_rows=keep_rows) if every_input else None
    words, tags = conll_columns(info)
    sentences, _ = read_conll(path, token_column=words, tag_column=tags)
    sentences = [split_cjk(s) for s in sentences]  # as the model was trained on them and predicts them
    for s in sentences:  # a column of other tags (part of speech) is no gold: said with its line and the way on
        M.check_tags(s.tags, f"{path}:{s.line}", f"; evaluate mode reads CoNLL column {tags} as the gold NER tags: "
                     "pass --no-evaluate to only predict the file")
    return Inputs([" ".join(s.words) for s in sentences], None, [s.tags for s in sentences],
                  words=[s.words for s in sentences])


def conll_columns(info: dict) -> tuple[int, int]:
    """The CoNLL columns of the words and the tags the model was trained on (`--token-column`,
    `--tag-column`, kept in bertkit_task.json's config), else the first and the last."""
    config = info.get("config") or {}
    return config.get("token_column", 0), config.get("tag_column", -1)

