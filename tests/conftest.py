"""Shared test fixtures: where the real data and the default model are.

Data and oracle tests skip on a developer machine without them, but fail in CI
(CI=true): there they must run, never silently skip.
"""

import importlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("BERTKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# As the `bertkit` command does for its own process (bertkit.cli.PROCESS), and before torch loads (its
# OpenMP runtime reads this once; nothing above imports torch): threads that finish their share of a
# parallel region sleep instead of spinning. The suite runs two xdist workers on two cores, each with
# torch's two threads: spinning threads took the cores the other worker's working threads needed
# (a tiny encoder's training steps beside another job: 13-16x the CPU time). Thread counts, and so
# every number a test computes, are unchanged; a policy the caller set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def need(condition: bool, why: str) -> None:
    """Skip locally, fail in CI, when a test's prerequisite is missing."""
    if not condition:
        if IN_CI:
            pytest.fail(f"required in CI: {why}")
        pytest.skip(why)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    need(SHARED_DATA.is_dir(), f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from bertkit.default_model import default_model_dir as find

    return find()


def oracle(module: str, name: str):
    """An oracle library of the dev extra: skipped locally, a failure in CI, when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        need(False, f"{name} (the oracle, dev extra) is not installed")


@pytest.fixture(scope="session")
def transformers_mod():
    return oracle("transformers", "transformers")


@pytest.fixture(scope="session")
def st():
    return oracle("sentence_transformers", "sentence-transformers")


@pytest.fixture(scope="session")
def pytrec_eval():
    return oracle("pytrec_eval", "pytrec_eval (pytrec-eval-terrier)")


@pytest.fixture(scope="module")
def rust_oracle(default_model_dir, transformers_mod):
    """The Rust tokenizer inside BertTokenizerFast, truncation and padding off (tests set them per call).

    Module scope: each test module gets its own instance, so one that toggles
    truncation or padding cannot leak it into another.
    """
    from tokenizers import Tokenizer as RustTokenizer

    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    assert len(fast) == 30522  # the real vocabulary, not the 5-token fallback of BertTokenizer(vocab_file=)
    rust = RustTokenizer.from_str(fast.backend_tokenizer.to_str())
    rust.no_truncation()
    rust.no_padding()
    return rust


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random encoder (2 layers, hidden 32, 4 heads, intermediate 37) saved with the default
    vocabulary: a model directory for the commands' end-to-end tests."""
    import torch

    from bertkit.model.config import BertConfig
    from bertkit.model.modeling import BertModel
    from bertkit.text.tokenizer import Tokenizer

    path = tmp_path_factory.mktemp("tiny")
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64)
    BertModel(config, generator=torch.Generator().manual_seed(0)).save_pretrained(path, tokenizer=Tokenizer.from_pretrained())
    return path
