"""Shared test fixtures: where the real data and the default model are.

Data and oracle tests skip on a developer machine without them, but fail in CI
(CI=true): there they must run, never silently skip.
"""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("BERTKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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


@pytest.fixture(scope="session")
def transformers_mod():
    try:
        import transformers
    except ImportError:
        need(False, "transformers (the oracle, dev extra) is not installed")
    return transformers
