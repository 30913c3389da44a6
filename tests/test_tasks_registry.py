"""A fine-tuning task is defined once: its record in bertkit.tasks.registry, looked up by name.

Checked here: every name a user or a file can give resolves to its record, and the command line,
the Hugging Face compatibility table and the records agree; no module outside the registry compares
a task's name; using a fine-tuned model loads none of the training code; and the one rerank
decision: a model is a cross-encoder for `search --rerank` exactly when the server answers /rerank
with it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.model.checkpoint import HF_TASKS
from bertkit.model.config import PROBLEM_TYPES
from bertkit.tasks import format_report, task_config
from bertkit.tasks.registry import TASKS, task_for, task_named

PACKAGE = Path(__file__).resolve().parent.parent / "bertkit"
NAMES = {"classify", "pair", "regression", "multi_label", "multi-label", "ner", "qa", "embed", "rerank"}


# --- every name resolves ---------------------------------------------------------------


def test_every_task_resolves_by_its_name_and_its_command():
    assert set(TASKS) == {"classify", "pair", "regression", "multi_label", "ner", "qa", "embed", "rerank"}
    for name, task in TASKS.items():
        assert task.name == name and task_named(name) is task and task_named(task.cli_name) is task
        assert task_config(task.cli_name) == (task.config, task.defaults)
    assert task_named("multi-label") is task_named("multi_label")
    with pytest.raises(BertkitError, match="unknown task 'summarize': choose one of classify, pair, regression, "
                                           "multi-label, ner, qa, embed, rerank"):
        task_named("summarize")


def test_a_runs_settings_find_their_task():
    from bertkit.tasks.config import EmbedConfig, NerConfig, QAConfig, TextTaskConfig

    assert task_for(NerConfig()) is TASKS["ner"] and task_for(QAConfig()) is TASKS["qa"]
    assert task_for(EmbedConfig()) is TASKS["embed"]
    for name in ("classify", "pair", "regression", "multi_label"):
        assert task_for(TextTaskConfig(task=name)) is TASKS[name]
    from bertkit.tasks.config import RerankConfig

    assert task_for(RerankConfig()) is TASKS["rerank"]
    with pytest.raises(BertkitError, match="unknown task 'ner2'"):
        task_for(TextTaskConfig(task="ner2"))
    with pytest.raises(BertkitError, match="the pair task needs --text-pair-column"):
        TASKS["pair"].check(TextTaskConfig(task="pair", text_pair_column=None))


def test_the_command_line_offers_one_command_per_record():
    from bertkit.cli import build_parser

    finetune = next(a for a in build_parser()._subparsers._group_actions[0].choices["finetune"]._actions
                    if a.dest == "task")
    assert list(finetune.choices) == [t.cli_name for t in TASKS.values()]
    # label_separator only where a label is a set (multi-label)
    offered = {name: {a.dest for a in p._actions} for name, p in finetune.choices.items()}
    assert [n for n, dests in offered.items() if "label_separator" in dests] == ["multi-label"]


def test_every_record_is_complete_and_its_run_exists():
    for task in TASKS.values():
        module, function = task.run.split(":")
        assert module.startswith("bertkit.tasks.")
        assert callable(getattr(__import__(module, fromlist=[function]), function))
        assert task.routes and task.report is not None and task.head
        predicted = [task.predict, task.read_inputs, task.read_labelled, task.score]
        assert all(f is not None for f in predicted) or task.name == "embed", task.name
        assert (task.problem_type is not None) == (task.head == "BertForSequenceClassification")


def test_hugging_face_heads_map_to_records_of_that_head():
    """checkpoint.HF_TASKS (the model layer cannot import the tasks) names only records, each of the head it
    is read from (an ELECTRA head: of its BERT form), and every record of those heads is reached by its problem type."""
    for head, task in HF_TASKS.items():
        names = task.values() if isinstance(task, dict) else [task]
        assert all(task_named(n).head == head.replace("Electra", "Bert", 1) for n in names)
        if isinstance(task, dict):
            assert all(task_named(n).problem_type == problem for problem, n in task.items())
    for task in TASKS.values():
        if task.head in HF_TASKS and task.problem_type:
            assert task_named(HF_TASKS[task.head][task.problem_type]).problem_type == task.problem_type


def test_every_task_formats_its_report():
    runs = {"classify": {"task": "classify", "train_examples": 4, "train_seconds": 1.0},
            "ner": {"task": "ner", "train_sentences": 3},
            "qa": {"task": "qa", "dev": {"exact_match": 50.0, "f1": 62.5}},
            "embed": {"task": "embed", "train_examples": 5, "loss": "mnrl", "pooling": "mean", "train_seconds": 2.0}}
    assert format_report(runs["classify"]) == "trained on 4 examples in 1.0 s (no dev set)"
    assert format_report(runs["ner"]) == "trained on 3 sentences (no dev set)"
    assert format_report(runs["qa"]) == "dev: exact match 50.00, F1 62.50"
    assert format_report(runs["embed"]) == "trained on 5 examples (mnrl, mean pooling) in 2.0 s (no dev set)"
    rerank = {"task": "rerank", "train_examples": 3, "train_seconds": 1.5,
              "pairs": {"queries": 1, "positives": 1, "hard_negatives": 1, "random_negatives": 1}}
    assert format_report(rerank) == ("trained on 3 pairs (1 queries, 1 positives, 1 hard negatives, 1 random "
                                     "negatives) in 1.5 s (no --dev: no retrieval figures recorded)")
    figures = {"dataset": "sf", "split": "test", "queries": 2, "rerank_top": 50, "first_stage": "idx (hybrid)",
               "before": {"ndcg@10": 0.7}, "after": {"ndcg@10": 0.43}}
    lines = format_report({**rerank, "retrieval": figures}).splitlines()
    assert lines[1] == ("sf split test (2 queries), top 50 of idx (hybrid): nDCG@10 0.7000 before reranking, "
                        "0.4300 after (-0.2700)") and lines[2].startswith("warning: this reranker lowers nDCG@10")
    assert format_report({}) == ""


# --- the name is compared nowhere else --------------------------------------------------


def _literals(node) -> set:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_literals(e) for e in node.elts)) if node.elts else set()
    return set()


def task_name_comparisons(root: Path) -> list[str]:
    """Every `x == "ner"`, `x in ("pair", "regression")`, ... in the package, except a problem type's
    (BertConfig.problem_type: "regression" is also one) held in a variable named so: `kind == "regression"`
    is a problem type, `kind == "ner"` a task's name all the same."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            names = set().union(_literals(node.left), *(_literals(c) for c in node.comparators)) & NAMES
            problem_type = isinstance(node.left, ast.Name) and node.left.id in ("problem_type", "kind")
            if problem_type:  # a problem type's name that is also a task's ("regression"), no other
                names -= set(PROBLEM_TYPES)
            if names:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {sorted(names)}")
    return found


def test_no_module_compares_a_task_name():
    """A new task is a record: nothing elsewhere decides by its name (there were 58 such comparisons
    in 14 modules before the registry)."""
    assert task_name_comparisons(PACKAGE) == []


def test_the_check_finds_a_comparison(tmp_path):
    (tmp_path / "bertkit").mkdir()
    (tmp_path / "bertkit" / "m.py").write_text('def f(info, kind):\n    return info["task"] == "qa" or kind == "ner"\n'
                                               'def g(kind):\n    return kind == "regression"\n')
    assert sorted(task_name_comparisons(tmp_path / "bertkit")) == ["bertkit/m.py:2 ['ner']", "bertkit/m.py:2 ['qa']"]


# --- using a model needs no training code ----------------------------------------------


def task_dir(path: Path, head: str, info: dict, labels=None, problem_type=None) -> Path:
    """A random task head (tiny odd shapes) saved as `bertkit finetune` saves its output."""
    import bertkit
    from bertkit.model.config import BertConfig
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64, problem_type=problem_type,
                        **({"id2label": dict(enumerate(labels))} if labels else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        getattr(bertkit, head)(config, generator=torch.Generator().manual_seed(1)).save_pretrained(
            path, tokenizer=Tokenizer.from_pretrained())
    (path / "bertkit_task.json").write_text(json.dumps({"max_length": 32, **info}))
    return path


def test_predicting_loads_no_training_code(tmp_path):
    model = task_dir(tmp_path / "pair", "BertForSequenceClassification",
                     {"task": "pair", "text_column": "a", "text_pair_column": "b"}, ["no", "yes"])
    code = ("import sys; from bertkit.tasks.predict import predict; from bertkit.tasks.rerank import reranker; "
            "from bertkit.serve.runner import TaskModel; "
            f"p = predict({str(model)!r}, ['a cat'], ['a dog']); assert set(p[0]) >= {{'label', 'probabilities'}}; "
            "print(sorted(m for m in sys.modules if m in ('bertkit.tasks.trainer', 'bertkit.training.loop', "
            "'bertkit.tasks.classification', 'bertkit.tasks.ner', 'bertkit.tasks.qa', 'bertkit.tasks.embedding')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


# --- one rerank decision ------------------------------------------------------------------

# (task, labels, trained on pairs) -> a cross-encoder? Written out by hand: one score per (query, text) pair,
# from a model that read pairs: a regression's score, or the second of two labels' probability.
MODELS = [
    ("pair", ["no", "yes"], True, True),
    ("pair", ["a", "b", "c"], True, False),
    ("classify", ["no", "yes"], True, True),  # classify --text-pair-column: the model `pair` makes
    ("classify", ["no", "yes"], False, False),
    ("regression", None, True, True),
    ("regression", None, False, False),
    ("multi_label", ["x", "y"], True, False),  # two independent sigmoids: no one score
    ("ner", ["O", "B-PER", "I-PER"], False, False),
    ("qa", None, True, False),
    ("rerank", ["relevant"], True, True),  # bertkit finetune rerank: one logit, its sigmoid
    ("multi_label", ["relevant"], True, False),  # the same head, not trained as a reranker
]


def _saved(path: Path, task: str, labels, pairs: bool) -> Path:
    record = TASKS[task]
    info = {"task": task, **({"text_column": "s1", "text_pair_column": "s2"} if pairs and task != "qa" else {})}
    head = "BertForQuestionAnswering" if task == "qa" else record.head
    return task_dir(path, head, info, labels if labels else (["score"] if task == "regression" else None),
                    record.problem_type)


@pytest.mark.parametrize("task,labels,pairs,expected", MODELS,
                         ids=[f"{m[0]}-{len(m[1] or [0])}-{'pairs' if m[2] else 'single'}" for m in MODELS])
def test_search_and_the_server_agree_on_which_models_rerank(tmp_path, task, labels, pairs, expected):
    from bertkit.runtime.loading import load
    from bertkit.serve.runner import TaskModel
    from bertkit.serve.settings import ServeConfig
    from bertkit.tasks.predict import predict
    from bertkit.tasks.rerank import reranker, score

    model = _saved(tmp_path / "m", task, labels, pairs)
    served = TaskModel(load(model, dtype="float32"), ServeConfig(), "m")
    assert served.can_rerank() == ("/rerank" in served.info()["endpoints"]) == expected
    if not expected:
        with pytest.raises(BertkitError, match="--rerank needs a cross-encoder"):
            reranker(str(model))
        return
    cross = reranker(str(model))
    [pred] = predict(None, ["a query"], ["a passage"], loaded=cross)
    reference = pred["score"] if task == "regression" else pred["probabilities"][labels[-1]]
    assert score(pred, cross) == served.rerank_score(pred) == pytest.approx(reference)


@pytest.mark.parametrize("task,switches", [(r.cli_name, {}) for r in TASKS.values()] + [("embed", {"static": True})])
def test_the_one_call_finetune_trains_as_the_command_does(monkeypatch, tmp_path, task, switches):
    """The chain from the command line to a script: `bertkit.tasks.finetune(task, ...)` and `bertkit finetune TASK`
    with the same options build the same run. The API took TrainConfig's own defaults (BERT's classifier recipe:
    3 epochs at 5e-5, batch 32) for every task, dropping the task's (embed and rerank: 1 epoch at 2e-5, rerank
    batch 16) and the --static preset's (batch 2048, lr 0.05, no weight decay): the same call trained a static
    table at 5e-5, where it barely moves."""
    import bertkit.cli.finetune as command
    import bertkit.tasks as tasks
    from bertkit.cli import main

    built = {}
    monkeypatch.setattr(command, "run_task", lambda cfg, **kw: built.setdefault("cli", cfg) and {})
    monkeypatch.setattr(tasks, "run_task", lambda cfg, **kw: built.setdefault("api", cfg) and {})
    flags = [f"--{name}" for name, on in switches.items() if on]
    main(["finetune", task, "--train", str(tmp_path / "t.tsv"), "--output", str(tmp_path / "o"), *flags])
    tasks.finetune(task, train=str(tmp_path / "t.tsv"), output=str(tmp_path / "o"), **switches)
    cli, api = built["cli"], built["api"]
    assert api.training == cli.training, (task, switches)
    assert api == cli
    # a few settings of a script go over the task's (and the switches') defaults as the same flags do: a
    # TrainConfig(max_steps=5) was the only way, and brought TrainConfig's own defaults for everything else
    built.clear()
    main(["finetune", task, "--train", str(tmp_path / "t.tsv"), "--output", str(tmp_path / "o"), *flags,
          "--max-steps", "5", "--learning-rate", "3e-4"])
    tasks.finetune(task, train=str(tmp_path / "t.tsv"), output=str(tmp_path / "o"), **switches,
                   training={"max_steps": 5, "optim": {"learning_rate": 3e-4}})
    assert built["api"].training == built["cli"].training, (task, switches)
    assert built["api"].training.max_steps == 5 and built["api"].training.optim.learning_rate == 3e-4
    assert built["api"] == built["cli"]


def test_a_switchs_preset_reaches_the_command_and_the_one_call_alike(monkeypatch, tmp_path):
    """A switch's preset (--static: the static recipe's settings) was layered twice: by the command
    (`options.merge`, every setting it holds) and by `finetune()` (`dataclasses.replace`, its training settings
    alone), so a preset that also set one of the task's own settings reached the command's run only. One rule now,
    `Task.defaults_with`."""
    import dataclasses

    import bertkit.cli.finetune as command
    import bertkit.tasks as tasks
    from bertkit.cli import main
    from bertkit.tasks.config import STATIC_RECIPE

    monkeypatch.setitem(TASKS, "embed", dataclasses.replace(TASKS["embed"], presets={
        "static": {**STATIC_RECIPE, "scale": 30.0}}))
    built = {}
    monkeypatch.setattr(command, "run_task", lambda cfg, **kw: built.setdefault("cli", cfg) and {})
    monkeypatch.setattr(tasks, "run_task", lambda cfg, **kw: built.setdefault("api", cfg) and {})
    main(["finetune", "embed", "--train", str(tmp_path / "t.tsv"), "--output", str(tmp_path / "o"), "--static"])
    tasks.finetune("embed", train=str(tmp_path / "t.tsv"), output=str(tmp_path / "o"), static=True)
    assert built["cli"].scale == built["api"].scale == 30.0
    assert built["api"] == built["cli"]
