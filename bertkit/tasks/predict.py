"""Using a fine-tuned model: `predict(model_dir, texts)` and `bertkit predict`.

The output directory of `bertkit finetune` is a Hugging Face checkpoint plus
`bertkit_task.json`, which says how inputs were encoded (task, max_length,
stride, columns). Prediction loads both and encodes new inputs the same way,
through the task's record (`bertkit.tasks.registry`):

- classify / pair / multi_label: {"label", "probabilities": {name: p}} (or
  {"labels", ...}); regression: {"score"};
- ner: each text is split into words as BERT's tokenizer splits it (punctuation and each CJK ideograph
  apart: "Paris." is "Paris" and "."), a list of words (a CoNLL file's sentence) kept as given ->
  {"words", "tags"};
- qa: `texts` are questions and `pairs` their contexts -> {"answer", "start", "end", "score"}.

A checkpoint without `bertkit_task.json` (e.g. one made by transformers) is
read from its config.json `architectures`.

An input without a word piece (empty, spaces, only characters BERT drops) is
refused, naming it: the model would read `[CLS] [SEP]` alone and answer with a
prediction like any other (the server and `bertkit.embed` refuse it too). A
file's row whose text is empty is skipped and counted by its reader.

Evaluate mode: when the input file carries the answers (a label column for the
text tasks, a tag column in a CoNLL file, answers in SQuAD JSON), `predict_file`
also scores the predictions with the task's metrics (`bertkit.metrics.tasks`):
accuracy and F1 for classification, Pearson and Spearman for regression, micro
F1 for multi-label, entity F1 for NER, exact match and F1 for QA (a SQuAD 2.0 file: the
v2.0 script's, with its HasAns/NoAns split). Every input is
predicted; one without its answer (an empty label cell, a SQuAD question without
answers) is left out of the scores, and a file whose answers are all missing is
only predicted.

The model is loaded by `bertkit.runtime.loading` on `device` (auto, cpu, cuda) in `dtype`
(float32, bfloat16, auto), int8 if asked. Nothing here imports the training code.
"""

from __future__ import annotations

import itertools
import json
import sys
from functools import partial
from pathlib import Path
from typing import NamedTuple

from bertkit.data.atomic import write_lines
from bertkit.data.tables import label_cell, probabilities_cell, tsv_cell
from bertkit.errors import BertkitError, int_at_least, switch
from bertkit.metrics.tasks import get_entities, predicted_tags
from bertkit.runtime.loading import Loaded, check_as_loaded, load
from bertkit.tasks.batching import run_model
from bertkit.tasks.registry import Task, task_named

TEXT_HEAD = "BertForSequenceClassification"  # the text tasks' (`bertkit.tasks.text_inference`): they count cut inputs


def load_task_model(model_dir, device=None, dtype=None, int8: bool = False, fast=True) -> Loaded:
    """A fine-tuned output directory loaded for prediction (`bertkit.runtime.loading.load`, head "task"):
    on `device` in `dtype` (None: auto, float32); int8: the encoder's dense layers quantized (CPU).
    A directory saved by `bertkit.runtime.quantization.save_quantized` loads as int8 whatever `int8` says."""
    return load(model_dir, head="task", device=device, dtype=dtype, int8=int8, fast=fast)


def task_of(loaded: Loaded) -> Task:
    """The record of the task a loaded model was fine-tuned for."""
    return task_named(loaded.info["task"])


def predict(model_dir, texts, pairs=None, *, batch_size: int = 32, loaded=None, device=None,
            dtype=None, int8: bool = False, fast=True, progress: bool = False,
            version_2: bool | None = None, on_cut=None, on_tokens=None) -> list[dict]:
    """Predictions for `texts` (and `pairs`, the second texts or QA contexts), one dict each.
    device: auto (None), cpu or cuda; dtype: float32 (None), bfloat16 or auto; int8: int8 dense layers;
    fast: the fast path's settings (`bertkit.runtime.loading.load`). loaded: a model `bertkit.load(model_dir)`
    returned (then device, dtype and int8 were decided there; model_dir: None, or that same folder).
    progress: a bar over the batches on standard error. version_2: a Hugging Face QA checkpoint trained on SQuAD
    v2 (`reading_info`). on_cut(cut, seen): told how many of the inputs the model read cut at its max_length,
    counted as they were encoded for it (a text task's model: classify, pair, regression, multi-label, rerank; a
    cross-encoder's pairs, `bertkit.tasks.rerank`); on_tokens(n): told, for the same models, how many tokens those
    encodings hold, before the model reads them (raising there stops it: a server's per-request limit). A NER model
    also takes a text as its words, a list of str, and tags those words."""
    texts = _text_list(texts, "texts", words=True)
    if not texts:
        raise BertkitError("no texts to predict: pass a non-empty list of texts")
    if pairs is not None:
        pairs = _text_list(pairs, "pairs")
        if len(pairs) != len(texts):
            raise BertkitError(f"{len(texts)} texts but {len(pairs)} pairs; give one second text per text")
    int_at_least(batch_size, 1, "batch_size", says="a positive int")
    _switches(progress=progress, version_2=version_2)
    if loaded is not None and not isinstance(loaded, Loaded):
        raise BertkitError(f"loaded must be a Loaded (bertkit.load(model_dir, head='task')), got {type(loaded).__name__}")
    if loaded is not None:
        _check_held(loaded)
        check_as_loaded(loaded, "loaded", "predict loads the model", device, dtype, int8)
        if model_dir is not None and loaded.directory is not None and Path(model_dir).resolve() != Path(
                loaded.directory).resolve():  # one of them names another model: not silently the loaded one's
            raise BertkitError(f"loaded holds {loaded.directory}'s model, not {model_dir}'s: pass model_dir=None "
                               "with loaded=, or load that folder")
    loaded = loaded or load_task_model(model_dir, device, dtype, int8, fast)
    task, info = task_of(loaded), reading_info(loaded, version_2)
    kind = type(loaded.model).__name__  # ELECTRA's heads share BERT's names after "For"
    if task.head != "BertModel" and kind.partition("For")[2] != task.head.partition("For")[2]:
        raise BertkitError(f"{loaded.directory}: bertkit_task.json says {task.name} ({task.head}) but config.json's "
                           f"architectures name {kind}: the two files disagree; fine-tune the model again")
    if task.refuses_pairs(loaded.info) and pairs is not None:
        reads = "tags single texts" if task.single else "was trained on single texts"
        raise BertkitError(f"this {task.cli_name} model {reads}: it reads no pairs; leave out pairs=")
    if task.takes_pairs(loaded.info) and pairs is None:
        raise BertkitError(f"this {task.cli_name} model reads {task.second} with each text: pass pairs=[...] "
                           "(one per text)")
    if not task.words and (i := next((i for i, t in enumerate(texts) if isinstance(t, list)), None)) is not None:
        raise BertkitError(f"texts[{i}] is a list of words, which a {task.cli_name} model does not read: join "
                           "them with spaces (a NER model tags the words of a list as given)")
    check_tokens(loaded.tokenizer, texts, "texts[{}]".format)
    if pairs is not None:
        check_tokens(loaded.tokenizer, pairs, "pairs[{}]".format)
    run = partial(run_model, loaded.model, batch_size=batch_size, progress=progress)
    if on_cut is None and on_tokens is None:
        return task.predict(run, loaded.tokenizer, texts, pairs, info, task.labels(loaded.config))
    if task.head != TEXT_HEAD:  # NER reads a long sentence whole, in windows; QA a context so, a question cut
        name = "on_cut" if on_cut is not None else "on_tokens"
        raise BertkitError(f"{name} counts what a text task's model reads, and this is a {task.cli_name} model: "
                           f"leave {name} out")
    return task.predict(run, loaded.tokenizer, texts, pairs, info, task.labels(loaded.config), on_cut=on_cut,
                        on_tokens=on_tokens)


# what predict says of a Hugging Face QA checkpoint read as SQuAD v1 (nothing in its folder says which it was trained on)
READ_AS_V1 = ("{model}: a Hugging Face QA checkpoint says nothing of SQuAD v2, so every question gets an answer (v1); "
              "for a model trained on SQuAD v2 (questions without one) pass --version-2-with-negative "
              "(predict(version_2=True))")


def reading_info(loaded: Loaded, version_2: bool | None) -> dict:
    """How the model reads its inputs: its task description, with `version_2` for a QA model read from a Hugging
    Face checkpoint. Its folder (config.json: BertForQuestionAnswering) does not say whether it was trained on
    SQuAD v2, so it is read as v1 (a span for every question) unless asked; then the no-answer rule of a model
    `bertkit finetune qa --version-2-with-negative` trained applies ('' where [CLS] scores above the best span).
    A bertkit QA folder says it itself (bertkit_task.json's version_2): another answer is refused."""
    info = loaded.info
    if version_2 is None:
        return info
    task = info.get("task")  # none for an encoder (the server loads either)
    if task is None or not task_named(task).no_answer:
        what = f"a {task} model" if task else "an encoder, not a fine-tuned model"
        raise BertkitError(f"--version-2-with-negative (version_2) is for a question-answering model, and "
                           f"{loaded.directory} is {what}: leave it out")
    if not info.get("inferred") and bool(info.get("version_2")) != bool(version_2):
        trained = "with" if info.get("version_2") else "without"
        raise BertkitError(f"{loaded.directory} was trained {trained} --version-2-with-negative (its bertkit_task.json "
                           "says so), which predict follows: leave the option out")
    return {**info, "version_2": bool(version_2)}


def _check_held(loaded: Loaded) -> None:
    """Refuse a Loaded that is not its folder's task model (an encoder, a static table) by what it holds."""
    task = loaded.info.get("task") if loaded.task != "static" else None
    if task == loaded.task:
        return
    kind = type(loaded.model).__name__
    if loaded.directory is None:
        held = f"a {kind} handed over in memory, without the task description of its folder (bertkit_task.json)"
    else:
        held = f"{loaded.directory}'s {kind}"
    if task is None:
        raise BertkitError(f"loaded holds {held}, not a fine-tuned task model: load the output folder of "
                           "`bertkit finetune` (bertkit.load(DIR))")
    raise BertkitError(f"loaded holds {loaded.directory}'s encoder ({kind}), not its {task} model: load it "
                       f"with bertkit.load({str(loaded.directory)!r}) (head 'auto' or 'task')")


def check_tokens(tok, texts: list[str], name) -> None:
    """Refuse a text without a word piece (empty, spaces, or only characters BERT drops: a zero-width space, a
    NUL), naming it (`name(i)` of its index): the model would read [CLS] [SEP] alone and answer with a
    label, a score, an answer that looks like any other. The server's routes and `bertkit.embed` refuse it too.
    Each text (a list of words: joined by spaces) is tokenized only as far as its first piece
    (`Tokenizer.ids_lists`)."""
    texts = [t if isinstance(t, str) else " ".join(t) for t in texts]
    for i, ids in enumerate(tok.ids_lists(texts, 1)):
        if not ids:
            raise BertkitError(f"{name(i)} {texts[i][:40]!r} yields no tokens (it is empty or holds only "
                               "characters BERT drops): the model would answer for an empty text; leave it out")


def _switches(**values) -> None:
    """Each a bool (None: the default, but progress), checked before the model loads: a str is true whatever it
    says (version_2="false" read a QA model as SQuAD v2; evaluate="false" asked for the scores)."""
    for name, value in values.items():
        switch(value, name, none=name != "progress")


def _text_list(texts, what: str, words: bool = False) -> list:
    """`texts` as a list of str, checked before the model loads (a str would be split into characters); with
    `words`, an item may be a list of str (a text's words: the task says whether it takes them)."""
    if isinstance(texts, str):
        raise BertkitError(f"predict takes a list of {what}; wrap a single text in a list")
    if texts is None or not hasattr(texts, "__iter__"):
        raise BertkitError(f"predict takes a list of {what}, got {type(texts).__name__}")
    texts = list(texts)
    for i, text in enumerate(texts):
        if words and isinstance(text, list) and all(isinstance(w, str) for w in text):
            continue
        if not isinstance(text, str):
            ner = "a list of str, which a NER model tags as given; else " if words else ""
            raise BertkitError(f"{what}[{i}] must be a str, got {type(text).__name__}"
                               + (f" (pre-split words: {ner}join them with spaces)" if isinstance(text, list) else ""))
    return texts


def feature_logits(loaded: Loaded, features: list[dict], batch_size: int = 64, progress: bool = False) -> list:
    """The model's logits for each of its task's features: [C] per input, or [t, C] per token (t: the
    feature's own length) for a token classifier."""
    out = run_model(loaded.model, features, batch_size, progress=progress, desc="teacher")["logits"]
    return [z if z.ndim == 1 else z[: len(f["input_ids"])] for z, f in zip(out, features)]


def format_tables(metrics: dict, task: str) -> str:
    """The lines under evaluate mode's figures, as finetune prints them under its dev figures (the task's `tables`):
    per label and the confusion matrix for a classifier, per entity type for NER; "" for the other tasks."""
    return "\n".join(task_named(task).tables(metrics))


class FileResult(NamedTuple):
    path: Path | str  # the predictions TSV ("-": standard output)
    count: int  # predictions written
    metrics: dict | None  # evaluate mode's scores, None when the file carries no answers
    precision: str = "float32"  # what the model computed in (`Loaded.precision`)
    scored: int = 0  # the predictions scored: those whose input carries an answer
    task: str | None = None  # the model's task (bertkit_task.json's name): `format_tables` lays out its metrics
    unpredicted: int = 0  # of `scored`, the inputs skipped (nothing to predict: SQuAD's empty question), scored 0


def default_output(input_path, folder=".") -> Path:
    """Where predictions go when no output is named: INPUT's name with .predictions.tsv, in `folder`
    (the current directory), never next to the input (a data folder is the user's) and never over an
    existing file: dev.predictions.tsv, else dev.predictions-2.tsv, -3, ..."""
    stem = Path(input_path).with_suffix("").name
    out = Path(folder) / f"{stem}.predictions.tsv"
    n = 2
    while out.exists():
        out = Path(folder) / f"{stem}.predictions-{n}.tsv"
        n += 1
    return out


def _write(out, lines) -> None:
    """The predictions' lines into the file `out`, whole or not at all (`bertkit.data.atomic`: written straight
    into it, a Ctrl-C or a kill left a header and the first k rows), or to standard output for "-"."""
    if str(out) == "-":
        sys.stdout.writelines(lines)
    else:
        write_lines(out, lines)


def predict_file(model_dir, input_path, output_path=None, *, text_column=None, text_pair_column=None,
                 label_column=None, batch_size: int = 32, evaluate: bool | None = None, device=None,
                 dtype=None, int8: bool = False, fast=True, log=print, progress: bool = False,
                 version_2: bool | None = None) -> FileResult:
    """Write one prediction per input row as TSV to `output_path` ("-": standard output; None: `default_output`, in
    the current directory): a table's rows with their columns as they were (names and cells), then prediction and
    details (`_output`); another file's text, the pair's second text or QA context where inputs come in pairs,
    prediction, details, and the input's id where the file names it (SQuAD's). With the answers in the file
    (evaluate None: whenever they are there; True:
    required; False: never) also score them: every row is predicted, the rows that carry an answer are
    scored. fast: the fast path's settings, as `bertkit.runtime.loading.load` takes them; progress: a bar over
    the batches; log: the readers' counts of skipped rows. version_2: as `predict`'s."""
    _switches(evaluate=evaluate, progress=progress, version_2=version_2)
    loaded = load_task_model(model_dir, device, dtype, int8, fast)
    info, task = reading_info(loaded, version_2), task_of(loaded)
    if version_2 is None and task.no_answer and info.get("inferred"):
        log(READ_AS_V1.format(model=model_dir))
    read = _read(task, input_path, info, (text_column, text_pair_column), label_column, evaluate, log)
    texts, pairs, references = read.texts, read.pairs, read.answers
    if evaluate and references is None:
        answers = task.answers.format(label=info.get("label_column") or "label")
        raise BertkitError(f"{input_path} carries no answers to evaluate against ({answers}); "
                           "drop --evaluate to only predict")
    if not texts:
        raise BertkitError(f"{input_path}: no inputs to predict")
    for side, name in ((texts, "input {}"), (pairs, "the second text of input {}")):
        if side is not None:  # named as the file's inputs, counted from 1 (predict's own check says texts[i])
            check_tokens(loaded.tokenizer, side, lambda i, name=name: f"{input_path}: {name.format(i + 1)}")
    if task.cut and (cut := task.cut(loaded.tokenizer, texts, pairs, info)):  # said once, before the run
        log(f"{input_path}: {cut}")
    given = texts  # a tagger reads the words a file gives as such (`Inputs.words`)
    if read.words is not None and task.words:
        given = [t if w is None else w for t, w in zip(texts, read.words)]
    preds = predict(model_dir, given, pairs, batch_size=batch_size, loaded=loaded, progress=progress,
                    version_2=version_2)
    # the answered inputs, then those the reader skipped (`Inputs.unpredicted`): no prediction, each scored 0
    scored = [i for i, r in enumerate(references or []) if r is not None]
    gold = [references[i] for i in scored] + list(read.unpredicted)
    scores = None if references is None else task.score([preds[i] for i in scored] + [None] * len(read.unpredicted),
                                                      gold, info, task.labels(loaded.config))
    out = default_output(input_path) if output_path is None else output_path
    out = out if str(out) == "-" else Path(out)
    # a multi-label set joined as the training file's cells were (`label_cell`): by ',' whatever the model's
    # --label-separator, a label 'pets, cats' read back as two
    names = task.labels(loaded.config) or () if preds and "labels" in preds[0] else ()
    shown = partial(_shown, separator=info.get("label_separator", ","), names=names)
    header, lines = _output(input_path, texts, pairs, read.ids, preds, read.rows, shown, log)
    _write(out, itertools.chain(["\t".join(map(tsv_cell, header)) + "\n"], ("\t".join(map(tsv_cell, row)) + "\n" for row in lines)))
    return FileResult(out, len(preds), scores, loaded.precision, len(gold), task.name, len(read.unpredicted))


def _read(task, path, info: dict, columns: tuple, label_column, evaluate: bool | None, log):
    """What the file `path` holds (`bertkit.data.tables.Inputs`), read once: its inputs with the answers it carries
    (`Task.read_labelled` with every_input: answers None where there are none), or without them where `evaluate`
    is False (`Task.read_inputs`)."""
    if evaluate is False:  # a table's rows kept: they are written back
        return task.read_inputs(path, info, *columns, log=log, keep_rows=True)
    return task.read_labelled(path, info, *columns, label_column, every_input=True, keep_rows=True, log=log)


def _output(input_path, texts, pairs, ids, preds: list[dict], rows: list[dict] | None, shown, log):
    """The predictions' header and rows. A table's rows (`rows`, one per input) keep their columns as they were,
    names and cells (a JSONL row's value as JSON, null empty), then the prediction and details: the text column was
    written as 'text' and every other column (an id, the label) left out. A column of the input named like one of
    the two (a 'prediction' column) stays; the new one is 'prediction.1' (.2, ...), said in one line to `log`.
    Another file (lines, CoNLL, SQuAD): text, the second text or context, prediction, details, the file's ids."""
    if rows:
        assert len(rows) == len(preds), (len(rows), len(preds))
        given = list(dict.fromkeys(name for row in rows for name in row))  # a JSONL row may lack a key, or add one
        added = [_distinct(name, given, input_path, log) for name in ("prediction", "details")]
        return given + added, ([_cell(row.get(c)) for c in given] + list(shown(p)) for row, p in zip(rows, preds))
    # the file's ids where it names its inputs (SQuAD's question ids, which the official script maps to answers;
    # the order alone did), last: the columns before keep their places
    header = ["text", *(["text_pair"] if pairs else []), "prediction", "details", *(["id"] if ids else [])]
    return header, ((t, *([second] if pairs else []), *shown(p), *([i] if ids else []))
                    for t, second, p, i in zip(texts, pairs or [None] * len(texts), preds, ids or [None] * len(texts)))


def _distinct(name: str, taken: list[str], input_path, log) -> str:
    """`name`, or `name`.1 (.2, ...) where the input has a column of that name (regardless of case, as bertkit's
    readers find a column), so that neither hides the other when the file is read back."""
    folded, out, n = {c.casefold() for c in taken}, name, 0
    while out.casefold() in folded:
        n += 1
        out = f"{name}.{n}"
    if out != name:
        log(f"{input_path}: its column {name!r} is written back as it was; the model's {name} is in column {out!r}")
    return out


def _cell(value) -> str:
    """A cell of the input as it was read: a TSV/CSV cell as it is, a JSON string as it is, null empty, another
    JSON value (a number, a list of words) as JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _shown(p: dict, separator: str = ",", names=()) -> tuple[str, str]:
    """A prediction's TSV cells: what was predicted, and its details (scores, offsets; a tagger's words, which
    its tags belong to: a text's Penn Treebank words, not the text split on spaces)."""
    if "tags" in p:
        return " ".join(p["tags"]), json.dumps(p["words"], ensure_ascii=False)
    if "answer" in p:
        return p["answer"], json.dumps({k: p[k] for k in ("start", "end", "score")})
    if "score" in p:
        return f"{p['score']:.4f}", ""
    pred = p["label"] if "label" in p else label_cell(p["labels"], separator, names)
    return pred, probabilities_cell(p["probabilities"])


def with_entities(text: str, prediction: dict) -> dict:
    """A NER prediction plus its entities with character offsets into `text` (what `bertkit serve` answers):
    `predict` splits the text into words as the Penn Treebank does (`ner_inference.ptb_spans`: punctuation
    around a word and each CJK ideograph apart, "U.S." whole, each word a slice of the text) and tags each word;
    an entity (conlleval's chunking of the tags) spans from its first word's first character to its last word's
    end, its punctuation outside ("Paris." gives Paris). Each word is found where the one before ended: only characters that are no word's
    (spaces, those BERT drops) lie between them."""
    spans, at = [], 0
    for word in prediction["words"]:
        at = text.index(word, at) + len(word)
        spans.append((at - len(word), at))
    entities = []
    for kind, first, last in get_entities(predicted_tags(prediction["tags"])):  # an IO model's "PER" too
        a, b = spans[first][0], spans[last][1]
        entities.append({"type": kind, "text": text[a:b], "start": a, "end": b, "words": [first, last + 1]})
    return {**prediction, "entities": entities}
