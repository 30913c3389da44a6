"""Using an extractive QA model: question + context -> windows, start/end logits -> the answer span.

What `bertkit.tasks.qa` trains (BertForQuestionAnswering, BERT section 4.2,
google-research/bert `run_squad.py`) is read back here:
- input `[CLS] question [SEP] context-window [SEP]`, the question cut to
  `max_query_length` pieces, segment 0 for the question and 1 for the context;
- a context longer than fits is covered by overlapping windows (doc stride;
  here the overlap, as in transformers' run_qa.py and our tokenizer);
- training labels are the answer's first and last piece in the window; a
  window that does not contain the whole answer (and, with SQuAD v2, an
  unanswerable question) points both at [CLS], position 0;
- decoding: per window the `n_best` highest start and end logits; a pair is a
  candidate if both lie in the context, end >= start, it is at most
  `max_answer_length` pieces long and the start has its maximum context in this
  window (`bertkit.text.windows`); the best start+end score wins across
  windows; the answer is cut from the ORIGINAL context with the pieces'
  character offsets (run_squad.py's `get_final_text` realigns normalised
  tokens instead; offsets make that unnecessary);
- SQuAD v2 (`version_2`): the no-answer score is the smallest [CLS] start+end
  over the windows; predict "" when it beats the best span by more than
  `null_score_diff_threshold`.

Answers whose `answer_start` does not point at their text are looked up in the
context (nearest occurrence) and counted; those never found are skipped and counted.

No torch here: `predict` gets `run(features)`, the model run over features
(`bertkit.tasks.batching.run_model`), so using a model needs no training code.
Shapes: start/end logits per window feature (T,).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from bertkit.data.squad import read_squad
from bertkit.data.tables import Inputs, QAExample, first_row, read_text_columns
from bertkit.metrics import tasks as M
from bertkit.tasks.config import QAConfig
from bertkit.text.windows import max_context_owner, read_tokens, spans

# what a QA model's bertkit_task.json keeps of its QAConfig, to encode and decode as it was trained
SETTINGS = ("max_length", "doc_stride", "max_query_length", "max_answer_length", "n_best", "version_2",
            "null_score_diff_threshold")


def locate_answer(context: str, text: str, start: int) -> int | None:
    """The answer's character start: `start` if it points at `text`, else the nearest occurrence, else None."""
    if context[start:start + len(text)] == text:
        return start
    hits, i = [], context.find(text)
    while i >= 0 and text:
        hits.append(i)
        i = context.find(text, i + 1)
    return min(hits, key=lambda h: abs(h - start)) if hits else None


def char_to_pieces(offsets, start: int, end: int) -> tuple[int, int] | None:
    """First and last piece overlapping the character span [start, end)."""
    inside = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
    return (inside[0], inside[-1]) if inside else None


def question_ids(tok, question: str, max_query_length: int) -> list[int]:
    return list(tok.encode(question, add_special_tokens=False, truncation=False).input_ids[:max_query_length])


def cut_line(tok, questions: list[str], contexts, info: dict) -> str | None:
    """What `bertkit predict` says of the questions the model reads cut at its max_query_length (`question_ids`:
    run_squad.py's rule; a context is read whole, in windows), None when it reads them all whole. Each question
    is read one piece past the cut (`Tokenizer.ids_lists`)."""
    limit = reading(info).max_query_length
    cut = sum(len(ids) > limit for ids in tok.ids_lists(list(questions), limit + 1))
    if not cut:
        return None
    return (f"{cut} of {len(questions)} questions are longer than the model's max_query_length of {limit} tokens: it "
            f"read only their first {limit} (as run_squad.py cuts them; the contexts are read whole, in windows)")


def context_encodings(tok, examples: list[QAExample]):
    """Each example's context encoded (pieces and offsets), each distinct context once: SQuAD asks about 5
    questions of a paragraph, and a long context was tokenized again for each. An encoding is held only until
    its context's last question (SQuAD's come paragraph by paragraph: one at a time)."""
    left, held = Counter(ex.context for ex in examples), {}
    for ex in examples:
        ctx = held.get(ex.context)
        if ctx is None:
            ctx = held[ex.context] = tok.encode(ex.context, add_special_tokens=False, truncation=False)
        left[ex.context] -= 1
        if not left[ex.context]:
            del held[ex.context]
        yield ctx


def make_features(tok, examples: list[QAExample], cfg: QAConfig, training: bool):
    """(features, skip counts). Eval features carry offsets and max-context flags for decoding."""
    feats, skipped = [], Counter()
    for i, (ex, ctx) in enumerate(zip(examples, context_encodings(tok, examples))):
        q = question_ids(tok, ex.question, cfg.max_query_length)
        size = cfg.max_length - len(q) - 3
        windows = spans(len(ctx.input_ids), size, cfg.doc_stride)
        owner = max_context_owner(windows, len(ctx.input_ids)) if not training else None
        target = None
        if training and not ex.is_impossible:
            text, start = ex.answers[0]
            found = locate_answer(ex.context, text, start)
            if found is None:
                skipped["answers not found in their context"] += 1
                continue
            if found != start:
                skipped["answer_start fixed to the text's nearest occurrence (kept)"] += 1
            target = char_to_pieces(ctx.offsets, found, found + len(text))
            if target is None:
                skipped["answers covering no token"] += 1
                continue
        first = len(q) + 2  # position of the window's first context piece
        for k, (s, e) in enumerate(windows):
            ids = [tok.cls_token_id, *q, tok.sep_token_id, *ctx.input_ids[s:e], tok.sep_token_id]
            f = {"input_ids": ids, "token_type_ids": [0] * first + [1] * (e - s + 1), "example_index": i}
            if training:
                if target is not None and s <= target[0] and target[1] < e:
                    f["start_positions"], f["end_positions"] = first + target[0] - s, first + target[1] - s
                else:
                    f["start_positions"] = f["end_positions"] = 0  # [CLS]: no (whole) answer in this window
            else:
                f.update(context_first=first, offsets=ctx.offsets[s:e],
                         max_context=[owner[p] == k for p in range(s, e)])
            feats.append(f)
    return feats, skipped


def best_answers(examples: list[QAExample], feats: list[dict], start_logits, end_logits, cfg: QAConfig) -> list[dict]:
    """The n-best decoding of run_squad.py; one {"answer", "start", "end", "score"} per example."""
    per_example: dict[int, list[int]] = {}
    for j, f in enumerate(feats):
        per_example.setdefault(f["example_index"], []).append(j)
    out = []
    for i, ex in enumerate(examples):
        best, null_score = None, None
        for j in per_example.get(i, []):
            # the feature's own positions: a padded batch's row (the guide's `collate`) has more, whose logits
            # took n-best slots
            n = len(feats[j]["input_ids"])
            f, s_log, e_log = feats[j], start_logits[j][:n], end_logits[j][:n]
            null = float(s_log[0] + e_log[0])
            null_score = null if null_score is None else min(null_score, null)
            first, n_ctx = f["context_first"], len(f["offsets"])
            starts = np.argsort(-s_log)[: cfg.n_best]
            ends = np.argsort(-e_log)[: cfg.n_best]
            for si in starts:
                a = si - first
                if not 0 <= a < n_ctx or not f["max_context"][a]:
                    continue
                for ei in ends:
                    b = ei - first
                    if not 0 <= b < n_ctx or b < a or b - a + 1 > cfg.max_answer_length:
                        continue
                    score = float(s_log[si] + e_log[ei])
                    if best is None or score > best[0]:
                        best = (score, f["offsets"][a][0], f["offsets"][b][1])
        if best is None or (cfg.version_2 and null_score - best[0] > cfg.null_score_diff_threshold):
            out.append({"answer": "", "start": -1, "end": -1, "score": null_score if null_score is not None else 0.0})
        else:
            score, s, e = best
            out.append({"answer": ex.context[s:e], "start": s, "end": e, "score": score})
    return out


def reading(info: dict) -> QAConfig:
    """How a model reads its inputs: the settings its bertkit_task.json keeps; those it lacks (a Hugging Face
    checkpoint keeps none) as run_squad.py's (questions cut at 64 pieces, windows sharing 128 tokens), at most a
    quarter of max_length for the question and half of it for the overlap, as transformers' QA pipeline cut its
    doc_stride: a model with fewer positions (max_length 128, 64) has a context window too short for 128, and
    its every input failed. With the question at a quarter, the window (3/4 of the length, less 3) always holds
    more than the overlap."""
    kept = {k: info[k] for k in SETTINGS if k in info}
    cfg = QAConfig(train="", output="", **{**dict.fromkeys(QAConfig.FITTED), **kept})
    cfg.fit(None)  # what the info lacks: the defaults, the question and the overlap fitted to the length (as a run's)
    return cfg


def window_tokens(info: dict, question: int, context: int) -> int:
    """The tokens the model reads of a question of `question` pieces and a context of `context`: each window
    `make_features` makes is [CLS] question (cut at max_query_length) [SEP] context span [SEP], so the question
    and the overlaps are read once per window (`read_tokens`: from the lengths, no windows made)."""
    cfg = reading(info)
    q = min(question, cfg.max_query_length)
    return read_tokens(context, cfg.max_length - q - 3, cfg.doc_stride, q + 3)


def predict(run, tok, questions: list[str], contexts: list[str], info: dict, names=None) -> list[dict]:
    """Each question's answer in its context: {"answer", "start", "end", "score"} (character offsets)."""
    cfg = reading(info)
    examples = [QAExample(str(n), q, c, []) for n, (q, c) in enumerate(zip(questions, contexts))]
    feats, _ = make_features(tok, examples, cfg, training=False)
    out = run(feats, outputs=("start_logits", "end_logits"), per_token=True)
    return best_answers(examples, feats, out["start_logits"], out["end_logits"], cfg)


def score(examples, preds, version_2: bool) -> dict:
    """SQuAD's figures over the questions, each scored: keyed by position, not by id (a hand-made file may number
    each paragraph's questions from 1; keyed by id, the questions sharing one collapsed into the last, silently).
    A None in `preds` is a question that got no prediction (skipped: an empty question or context): it scores 0
    and counts, as evaluate-v1.1.py scores an unanswered question (`squad_scores`)."""
    refs = {i: [t for t, _ in ex.answers] for i, ex in enumerate(examples)}
    return M.squad_scores({i: p["answer"] for i, p in enumerate(preds) if p is not None}, refs, v2=version_2)


def score_answers(preds: list[dict], examples: list[QAExample], info: dict, names=None) -> dict:
    """SQuAD's exact match and F1: v2.0's rules and figures when the model was trained for unanswerable
    questions or the file has some (a SQuAD 2.0 file is scored by the v2.0 script whatever answered it: v1.1's
    rules have no empty answer, so an unanswerable question's empty answer matched for exact match and not F1)."""
    return score(examples, preds, bool(info.get("version_2")) or any(e.is_impossible for e in examples))


# --- files -----------------------------------------------------------------

def is_squad(path) -> bool:
    """SQuAD JSON, or Hugging Face's squad/squad_v2 saved as JSON lines (a question, its context and its
    answers per line), which `finetune qa` reads too; another JSON-lines file is a table."""
    suffix = Path(path).suffix.lower()
    return suffix == ".json" or (suffix in (".jsonl", ".ndjson") and
                                 {"question", "context", "answers"} <= set(first_row(path)))


def squad_inputs(path, log=print) -> tuple[list[QAExample], list[QAExample]]:
    """Every question of a SQuAD file (answered or not) but those whose question or context is empty (or spaces):
    skipped and counted, as predict's readers skip a table's empty cell (`read_text_columns`); the whole file
    was refused for one. Returns (the questions kept, those skipped)."""
    examples, report = read_squad(path, unanswered=True)
    kept, skipped = [], []
    for e in examples:
        (kept if e.question.strip() and e.context.strip() else skipped).append(e)
    if skipped:
        report.kept = len(kept)
        report.skipped["questions with an empty question or context"] = len(skipped)
        log(report.summary())
    return kept, skipped


def read_inputs(path, info: dict, text_column=None, text_pair_column=None, log=print, *,
                keep_rows: bool = False) -> Inputs:
    """Every question of a SQuAD file, answered or not, with its context and its id (what the official evaluation
    script maps to answers), or a table's question and context columns (with `keep_rows` its rows)."""
    return read_labelled(path, info, text_column, text_pair_column, every_input=True, keep_rows=keep_rows,
                         log=log)._replace(answers=None, unpredicted=())


def read_labelled(path, info: dict, text_column=None, text_pair_column=None, label_column=None, *,
                  every_input: bool = False, keep_rows: bool = False, log=print) -> Inputs | None:
    """The questions of a SQuAD file with answers (`QAExample`s), else None: the answered questions, or with
    `every_input` every question, None in place of an unanswered one's example (and a file without answers, or a
    table, read all the same, answers None; `keep_rows`: a table's rows). A file is parsed once, its skipped questions said once. Those skipped
    (`squad_inputs`) that carry answers are the `unpredicted`: nothing is predicted for them, and each scores 0 in
    the figures, as the official evaluate-v1.1.py counts every question of the file and gives an unanswered one 0
    (they were left out of the count: exact match over 79 of 80 questions)."""
    if not is_squad(path):
        return read_text_columns(path, text_column or "question", text_pair_column or "context", log=log,
                                 keep_rows=keep_rows) if every_input else None
    examples, skipped = squad_inputs(path, log)
    answered = [e if e.answers or e.is_impossible else None for e in examples]
    unpredicted = tuple(e for e in skipped if e.answers or e.is_impossible)
    if not (any(answered) or unpredicted or every_input):
        return None
    kept = [i for i, e in enumerate(answered) if every_input or e is not None]
    return Inputs([examples[i].question for i in kept], [examples[i].context for i in kept],
                  [answered[i] for i in kept] if any(answered) or unpredicted else None,
                  [examples[i].id for i in kept], unpredicted=unpredicted)
