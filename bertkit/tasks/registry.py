"""A fine-tuning task, defined once: one record per task, looked up by name in one table.

A task is what `bertkit finetune TASK` trains and what `bertkit predict`,
`bertkit serve`, `search --rerank` and evaluate mode use afterwards. Everything
that differs between tasks is a field of its record, so a task's name is
compared nowhere else (tests/test_tasks_registry.py checks that):

    name, command      how bertkit_task.json / the command line spell it ("multi_label" / "multi-label")
    config, defaults   its settings (bertkit.tasks.config) and the task's own defaults over the class's
    run                its training run, "module:function" (imported by `bertkit.tasks.run_task` when a
                       run starts: it needs torch, and the run modules ask this table for their own record)
    head, problem_type the class it fine-tunes (config.json's architectures) and, for the sequence
                       classifier, what a label is (BertConfig.problem_type: the loss and the decoding)
    metrics            the figures its dev evaluation returns, each with whether higher is better
                       (`--metric` names one; the first, `metric`, is the default that picks the best epoch;
                       none: no epoch is picked by a score)
    predict            (run, tokenizer, texts, pairs, info, labels) -> one dict per input; `run(features)`
                       is the model run over features (bertkit.tasks.batching), so no training code is needed
    read_inputs, read_labelled, score, answers
                       a file's inputs; its inputs with the answers (None where it carries none; with every_input,
                       evaluate mode's one reading: every input, answers None where there are none); their metrics;
                       what the answers look like (for messages). The readers return what they read as
                       `bertkit.data.tables.Inputs`: the texts, pairs, answers, the inputs' ids where the file names
                       them (SQuAD's: predict writes them as its last column), a table's rows where the caller asks
                       (keep_rows=True: predict writes their columns back; others hold none) and the answers of inputs the reader skipped (`unpredicted`: scored with None
                       for a prediction, SQuAD's unanswered 0)
    answer_labels      (labels, info) -> the label names its predictions use where a model's info changes them from
                       config.json's (an IOB1 tagger answers I-X for the B-X it was trained on): what /info lists
    report             the run's final metrics -> the lines `bertkit finetune` prints
    tables             a scored set's metrics -> the lines under its figures (per label and the confusion matrix;
                       per entity type), in finetune's report and predict's evaluate mode alike
    inputs             what one input is called in counts: examples, sentences (NER), questions (QA)
    features           (tokenizer, texts, pairs, answers, info, labels) -> training features encoded as the
                       model was trained, with the labels where `answers` (read_labelled's) are given: what
                       `bertkit distill layers` trains a fine-tuned model's student on (None: not offered)
    cut                (tokenizer, texts, pairs, info) -> the line `bertkit predict` says of the inputs the model reads
                       cut (at its max_length; QA's questions at max_query_length), None when it reads them all whole
                       (None: it windows every input)
    question_limit     (info) -> where the first text of a pair is cut whatever its length (QA's max_query_length),
                       which the server counts as a cut; None: no such cut
    window_tokens      (info, pieces of a text, of its pair or None) -> the tokens the model reads of an input it
                       reads in windows, each window's special tokens (and QA's question) and overlap counted: what
                       the server's --max-request-tokens counts (QA, NER; a text task's single text with --stride)
    routes, pair_score the server routes that answer it; how a prediction of one (query, text) pair becomes
                       a cross-encoder's score (None: the task cannot rerank, see `can_rerank`)
    rerank_labels      how many labels a labelled cross-encoder has: two for a pair classifier (the second's
                       probability), one for a reranker (its sigmoid)
    raw_scores         its predictions' scores are the head's output as it is (a regression's, a QA answer's start
                       and end logits summed), not probabilities: what the server's `raw_scores: true` (TEI's
                       option) asks for
    no_answer          it may answer nothing (SQuAD 2.0's rule, `version_2`), which a Hugging Face folder
                       never says: predict reads such a folder as v1 unless asked
    presets            a switch's own defaults: {a boolean setting: settings put on top of `defaults` when the
                       command or `finetune()` turns it on (`Task.defaults_with`)} (embed's --static: the static
                       recipe's batch and rate)

The "embed" record is the sentence encoder: it trains with `bertkit finetune
embed` and is served on the embedding routes; it is not predicted through here
(`bertkit.embed`). Nothing here imports torch, so the command line builds its
options from this table without it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Callable, Mapping

from bertkit.errors import BertkitError
from bertkit.model.config import MULTI_LABEL, REGRESSION, SINGLE_LABEL
from bertkit.options import merge
from bertkit.tasks import ner_inference as ner, qa_inference as qa, reports, text_inference as text
from bertkit.tasks.config import (EMBED_DEV, STATIC_RECIPE, EmbedConfig, NerConfig, QAConfig, RerankConfig,
                                  TextTaskConfig, TrainConfig)

# the names of the training loop's settings and of its optimizer's (OptimConfig's), which training= takes
TRAINING_SETTINGS = frozenset(f.name for f in fields(TrainConfig))
OPTIMIZER_SETTINGS = frozenset(f.name for f in fields(TrainConfig().optim))


@dataclass(frozen=True)
class Task:
    """One fine-tuning task (see the module docstring for the fields)."""

    name: str
    config: type
    run: str
    report: Callable[[dict], str]
    head: str
    metrics: dict = field(default_factory=dict)  # the dev figures: name -> higher is better (see METRICS)
    command: str | None = None  # None: the name
    defaults: dict = field(default_factory=dict)
    help: str | None = None  # the command's description (None: "fine-tune for NAME")
    hidden: tuple = ()  # config fields this task's command does not offer
    problem_type: str | None = None
    predict: Callable | None = None
    read_inputs: Callable | None = None
    read_labelled: Callable | None = None
    answer_labels: Callable | None = None
    score: Callable | None = None
    answers: str = ""  # {label}: the label column
    pairs: bool = False  # inputs always come in pairs (pair: two sentences; qa: question, context)
    second: str = "a second text"  # the pair's second text, in messages
    single: bool = False  # reads single texts only: pairs are refused, not dropped (a tagger)
    labelled: bool = True  # predictions name the labels of config.json (id2label)
    entities: bool = False  # predictions are tags whose entities the server spells out with offsets
    words: bool = False  # an input may come as its words (a list of str: a CoNLL sentence's), tagged as given
    windows: bool = False  # a long input is read whole, in overlapping windows (else cut at max_length, or
    # for the text tasks windowed when trained with --stride: `bertkit.tasks.text_inference`)
    cut: Callable | None = None
    # (info, pieces of a text, of its pair or None) -> the tokens the model reads of an input it reads in windows
    window_tokens: Callable | None = None
    question_limit: Callable | None = None  # (info) -> where a pair's first text is cut (QA's max_query_length)
    routes: tuple = ("/predict", "/tokenize")
    pair_score: Callable | None = None
    features: Callable | None = None
    rerank_labels: int = 2  # the labels a labelled cross-encoder of this task has (its score: the last one's)
    raw_scores: bool = False
    no_answer: bool = False
    presets: dict = field(default_factory=dict)
    tables: Callable[[dict], list] = reports.no_tables
    inputs: str = "examples"  # what one input is, in counts (finetune's and predict's): "112 sentences"

    @property
    def cli_name(self) -> str:
        return self.command or self.name

    @property
    def metric(self) -> str | None:
        """The dev figure that picks the best epoch unless --metric names another."""
        return next(iter(self.metrics), None)

    def takes_pairs(self, info: dict) -> bool:
        """Whether a model of this task reads (text, second text): always, or as it was trained."""
        return self.pairs or bool(info.get("text_pair_column"))

    def refuses_pairs(self, info: dict) -> bool:
        """Whether pairs given to it are refused: a tagger's always, a model trained on single texts too.
        A Hugging Face head checkpoint says nothing of what it was trained on (its task is inferred from
        config.json: `bertkit.model.checkpoint.task_info`), so it reads single texts or pairs as given:
        a cross-encoder saved by transformers or sentence-transformers is such a folder."""
        return self.single or not (self.takes_pairs(info) or info.get("inferred"))

    def labels(self, config) -> list | None:
        """The label names its predictions use (config.json's id2label), None when they name none. Two labels of
        one name are refused: a prediction's probabilities by name kept one of them, and evaluate mode's
        label2id one id (a correct prediction of the other scored as wrong)."""
        names, first = (config.labels if self.labelled else None), {}
        for i, name in enumerate(names or ()):
            if first.setdefault(name, i) != i:
                raise BertkitError(f"config.json's id2label names {name!r} for labels {first[name]} and {i}: "
                                   "predictions could not tell them apart; give each label its own name there")
        return names

    def answered(self, labels, info: dict) -> list | None:
        """The label names a model's predictions use: `labels` (config.json's), as `answer_labels` changes them."""
        return self.answer_labels(labels, info) if self.answer_labels else labels

    def can_rerank(self, info: dict, labels) -> bool:
        """A cross-encoder: trained on (query, text) pairs, one score per pair: a regression's score,
        or the probability of the second of two labels (of a reranker's one label). `bertkit search
        --rerank`, `bertkit evaluate --rerank` and the server's /rerank all ask this."""
        return (self.pair_score is not None and not self.refuses_pairs(info)
                and (not self.labelled or len(labels or ()) == self.rerank_labels))

    def served_routes(self, info: dict, labels) -> list:
        """The server routes a model of this task answers."""
        rerank = ["/rerank"] if self.can_rerank(info, labels) else []
        return [self.routes[0], *rerank, *self.routes[1:]]

    def check(self, cfg) -> None:
        """A run's settings fit this task (`run_task` asks before anything loads, the text tasks' run again):
        its config class, the second-text column a pair task needs, and --metric (`check_metric`)."""
        if not isinstance(cfg, self.config):
            raise BertkitError(f"the {self.cli_name} task takes a {self.config.__name__}, got a {type(cfg).__name__}")
        if self.pairs and not getattr(cfg, "text_pair_column", True):
            raise BertkitError(f"the {self.cli_name} task needs --text-pair-column (the second sentence's column)")
        self.check_metric(cfg.training.metric, cfg.dev)

    def defaults_with(self, switches: dict | None = None) -> dict:
        """The settings a run of this task starts from: its own defaults, then the preset of each switch that
        `switches` (option name -> value) turns on (static=True: the static recipe's batch and rates), merged
        setting by setting (`bertkit.options.merge`). The one rule of `bertkit finetune TASK --static` and of
        `finetune(task, static=True)`: layered twice, the one-call API had taken a preset's training settings alone."""
        layered = self.defaults
        for switch, preset in self.presets.items():
            if (switches or {}).get(switch):
                layered = merge(layered, preset)
        return layered

    def own_training(self, training, options: dict | None = None) -> TrainConfig:
        """The one-call `finetune`'s training= as the run's own TrainConfig (the run settles its metric in it, and a
        script may hand the same settings to its next run). None: what `bertkit finetune TASK` starts from,
        TrainConfig's defaults (BERT's classifier recipe, 3 epochs at 5e-5) under the task's own and its switches'
        presets (`defaults_with`: embed, rerank: 1 epoch at 2e-5; static=True: the static recipe's batch and rates).
        A mapping: its settings over that start, as the command's flags go over it ({"max_steps": 5, "optim":
        {"learning_rate": 1e-4}}: a TrainConfig(max_steps=5) brought the classifier's recipe for the rest). A
        TrainConfig: taken whole, every setting as it says (a copy)."""
        if isinstance(training, TrainConfig):
            return copy.deepcopy(training)
        if training is not None and not isinstance(training, Mapping):
            raise BertkitError(f"training must be a dict of settings over the task's defaults (e.g. training="
                               f"{{'epochs': 3}}) or a whole TrainConfig, got {type(training).__name__}")
        start = TrainConfig()
        for layer in (self.defaults_with(options).get("training", {}), training or {}):
            start = _layered(start, layer)
        return start

    def check_option(self, name: str, value) -> None:
        """A keyword of the one-call `finetune` that is no setting of this task's config: a training or optimizer
        setting (said with the `training=` that carries it; it was a TypeError) or a misspelt option."""
        own = [f.name for f in fields(self.config)]
        if name in own:
            return
        if name not in TRAINING_SETTINGS | OPTIMIZER_SETTINGS:
            raise BertkitError(f"finetune({self.name!r}) has no option {name!r}; its options: {', '.join(own)}")
        raise BertkitError(f"finetune({self.name!r}): {name} is a training setting, not the task's: pass "
                           f"training={_spelt(name, value)} (bertkit.tasks.config.TrainConfig, "
                           "bertkit.training.optim.OptimConfig)")

    def check_metric(self, metric: str | None, dev) -> None:
        """--metric names one of this task's dev figures, and there is a --dev to score: an unknown name failed
        only after the first epoch, and without --dev it was never read."""
        if metric is None:
            return
        if not self.metrics:
            raise BertkitError(f"the {self.cli_name} task picks no epoch by a score (its last one is saved): "
                               f"leave out --metric {metric}")
        if metric not in self.metrics:
            raise BertkitError(f"unknown --metric {metric!r}: the {self.cli_name} task's dev evaluation gives "
                               f"{', '.join(self.metrics)}")
        if not dev:
            raise BertkitError(f"--metric {metric} picks the best epoch by its score on --dev: give --dev too, or "
                               "leave --metric out (without --dev the last epoch is saved)")

    def settle_metric(self, cfg) -> None:
        """The dev figure that picks the best epoch (--metric, else the record's first) and which way is better;
        without --dev nothing is scored, so the metric stays unset (a --resume checks it again)."""
        if cfg.dev:
            cfg.training.metric = cfg.training.metric or self.metric
            cfg.training.greater_is_better = self.metrics[cfg.training.metric]


def _spelt(name: str, value) -> str:
    """A training setting as training= takes it: {'max_steps': 5}, an optimizer's {'optim': {'learning_rate': ...}}."""
    optim = name not in TRAINING_SETTINGS
    return repr({"optim": {name: value}} if optim else {name: value})


def _layered(training: TrainConfig, layer: Mapping) -> TrainConfig:
    """`training` with the settings of `layer` (a preset's "training", or a script's training=) over it; an
    optimizer's under "optim". A name that is no setting is refused, naming where it belongs."""
    layer = dict(layer)
    optim = layer.pop("optim", {})
    if not isinstance(optim, Mapping):
        raise BertkitError(f"training: 'optim' takes a dict of optimizer settings, e.g. {{'learning_rate': 2e-5}}, "
                           f"got {type(optim).__name__}")
    for kind, given, known in (("training", layer, TRAINING_SETTINGS), ("optimizer", optim, OPTIMIZER_SETTINGS)):
        for name, value in given.items():
            if name not in known:  # replace's TypeError named no fix; a setting in the wrong place is spelt right
                fix = f": pass training={_spelt(name, value)}" if name in TRAINING_SETTINGS | OPTIMIZER_SETTINGS else ""
                raise BertkitError(f"training: {name!r} is no {kind} setting{fix} (bertkit.tasks.config.TrainConfig, "
                                   "bertkit.training.optim.OptimConfig)")
    return replace(training, **layer, optim=replace(training.optim, **optim))


def _last_label(prediction: dict, labels: list) -> float:
    return float(prediction["probabilities"][labels[-1]])


def _score(prediction: dict, labels) -> float:
    return float(prediction["score"])


# What each task's dev evaluation returns, name -> whether higher is better; `--metric` names one of them,
# the first is the default (embed's: EMBED_DEV, by the kind of its --dev, beside its settings in
# bertkit.tasks.config). tests/test_task_metrics.py runs every evaluation and checks these are its keys.
METRICS = {
    SINGLE_LABEL: {"accuracy": True, "macro_f1": True, "f1": True, "matthews_correlation": True,  # f1: two labels only
                   "held_out_loss": False},
    REGRESSION: {"pearson": True, "spearman": True, "mse": False, "held_out_loss": False},
    MULTI_LABEL: {"micro_f1": True, "micro_precision": True, "micro_recall": True, "subset_accuracy": True,
                  "held_out_loss": False},
    "ner": {"f1": True, "precision": True, "recall": True},  # conlleval's, over entities
    "qa": {"f1": True, "exact_match": True},  # SQuAD's
}


def _text(name: str, problem_type: str, config=TextTaskConfig,
          run: str = "bertkit.tasks.classification:finetune_text", report=reports.text_report, **more) -> Task:
    """A task of BertForSequenceClassification (bertkit.tasks.classification, bertkit.tasks.text_inference): the
    text tasks share their functions, told apart by the problem type."""
    more.setdefault("metrics", METRICS[problem_type])
    return Task(name, config, run, report, "BertForSequenceClassification", problem_type=problem_type,
                defaults={**({"task": name} if config is TextTaskConfig else {}), **more.pop("defaults", {})},
                predict=partial(text.predict, problem_type=problem_type), read_inputs=text.read_inputs,
                read_labelled=partial(text.read_labelled, problem_type=problem_type),
                score=partial(text.score_answers, problem_type=problem_type), answers="a {label!r} column",
                features=partial(text.training_features, problem_type=problem_type), tables=reports.label_tables,
                cut=text.cut_line, window_tokens=partial(ner.window_tokens, reading=text.window_reading),
                **more)


TASKS = {t.name: t for t in (
    _text("classify", SINGLE_LABEL, hidden=("label_separator",), pair_score=_last_label),
    _text("pair", SINGLE_LABEL, hidden=("label_separator",), pair_score=_last_label, pairs=True,
          defaults={"text_column": "sentence1", "text_pair_column": "sentence2"}),
    _text("regression", REGRESSION, hidden=("label_separator",), labelled=False, pair_score=_score,
          raw_scores=True),
    _text("multi_label", MULTI_LABEL, command="multi-label", defaults={"label_column": "labels"}),
    Task("ner", NerConfig, "bertkit.tasks.ner:finetune_ner", reports.ner_report, "BertForTokenClassification",
         help="tag words (named entities) from CoNLL column files: one 'word ... TAG' line per word, a blank line "
              "between sentences, -DOCSTART- lines skipped; tags BIO, or CoNLL-2003's own IOB1 with --tag-scheme "
              "iob1; each word's label sits on its first word piece; scored by conlleval's entity F1 and written "
              "to OUTPUT/dev_predictions.conll (word, gold, predicted). `bertkit predict` then tags new text "
              "split into words as BERT's tokenizer splits it (punctuation and each CJK ideograph apart: "
              "'Paris.' is Paris and .), and CoNLL files' words as they are (a CoNLL word holding CJK ideographs "
              "is split into one word each, for training too, its tag continued: a two-ideograph B-LOC word "
              "becomes B-LOC, I-LOC).",
         metrics=METRICS["ner"], predict=ner.predict, read_inputs=ner.read_inputs,
         answer_labels=ner.answered_tags,
         read_labelled=ner.read_labelled, score=ner.score_answers, answers="a CoNLL file with a tag column",
         entities=True, words=True, windows=True, window_tokens=ner.window_tokens, features=ner.training_features,
         single=True, tables=reports.type_lines, inputs="sentences"),
    Task("qa", QAConfig, "bertkit.tasks.qa:finetune_qa", reports.qa_report, "BertForQuestionAnswering",
         help="extractive question answering on SQuAD JSON (v1.1; v2.0 with --version-2-with-negative; Hugging "
              "Face's squad saved as JSON lines): a long context is read in overlapping windows and the answer "
              "is the best start and end piece; scored by SQuAD's exact match and F1, the answers written to "
              "OUTPUT/dev_predictions.json (id -> answer, the official evaluation script's input).",
         metrics=METRICS["qa"], predict=qa.predict, read_inputs=qa.read_inputs, read_labelled=qa.read_labelled,
         score=qa.score_answers, answers="SQuAD JSON with answers", pairs=True, cut=qa.cut_line,
         question_limit=lambda info: qa.reading(info).max_query_length, window_tokens=qa.window_tokens,
         second="a context", labelled=False,
         windows=True, no_answer=True, inputs="questions", raw_scores=True),  # an answer's score: start + end logits
    # the reference recipe (sentence-transformers, SciFact): 1 epoch at 2e-5
    Task("embed", EmbedConfig, "bertkit.tasks.embedding:finetune_embed", reports.embed_report, "BertModel",
         metrics=dict.fromkeys([name for names in EMBED_DEV.values() for name in names], True),
         defaults={"training": {"epochs": 1.0, "optim": {"learning_rate": 2e-5}}},
         help="train sentence embeddings (multiple-negatives ranking, cached/GradCache, CoSENT, Matryoshka) on "
              "pairs, triplets, scored pairs or a BEIR folder; saves the sentence-transformers layout "
              "(docs/embeddings.md). With in-batch negatives --grad-accum is not a bigger batch; --loss "
              "cached-mnrl is.",
         labelled=False, routes=("/v1/embeddings", "/embed", "/tokenize"), presets={"static": STATIC_RECIPE},
         # its batches are drawn without duplicate texts (EmbeddingBatches), never grouped by length:
         # --no-group-by-length was taken, recorded in run_config.json and changed nothing
         hidden=("group_by_length",)),
    # one logit per (query, passage), binary cross-entropy: a multi-label head of one label, read as its sigmoid;
    # sentence-transformers' reranker recipe: 1 epoch at 2e-5. Its --dev evaluation (the retrieval figures before
    # and after reranking) runs once, after training: no figure picks an epoch, so it offers no --metric
    _text("rerank", MULTI_LABEL, config=RerankConfig, metrics={}, run="bertkit.tasks.cross_encoder:finetune_rerank",
          report=reports.rerank_report, pairs=True, second="a passage", pair_score=_last_label, rerank_labels=1,
          hidden=("max_dev_examples", "metric"),
          defaults={"training": {"epochs": 1.0, "batch_size": 16, "optim": {"learning_rate": 2e-5}}},
          help="train a cross-encoder reranker (one logit, binary cross-entropy) on a BEIR folder's queries with "
               "mined hard and random negatives, or on (query, passage, label) rows; --dev --index records nDCG@10 "
               "before and after reranking in OUTPUT/retrieval.json, which search/serve --rerank read "
               "(docs/search.md)"),
)}
_BY_COMMAND = {t.cli_name: t for t in TASKS.values()}


def task_named(name: str) -> Task:
    """The record of a task, by the name bertkit_task.json or the command line gives it."""
    task = TASKS.get(name) or _BY_COMMAND.get(name)
    if task is None:
        raise BertkitError(f"unknown task {name!r}: choose one of {', '.join(_BY_COMMAND)}")
    return task


def task_for(cfg) -> Task:
    """The record of a run's settings: a TextTaskConfig names its task, the other configs are one task's."""
    named = getattr(cfg, "task", None)
    if named is not None:
        return task_named(named)
    for task in TASKS.values():
        if type(cfg) is task.config:
            return task
    raise BertkitError(f"{type(cfg).__name__} is the settings of no fine-tuning task")
