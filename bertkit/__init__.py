"""bertkit: BERT written from scratch on PyTorch.

The public surface is small on purpose: the tokenizer, the config and model,
the task heads, and a few one-call helpers. Everything else lives in the module
named after its concept (see the README's tour).

Public names are resolved on first use (PEP 562 `__getattr__`), so `import
bertkit` is instant and the tokenizer never pulls in torch.
"""

import importlib

from bertkit.errors import BertkitError

__version__ = "0.1.0"

# public name -> module that defines it (imported lazily, see __getattr__)
_LAZY = {
    "Tokenizer": "bertkit.text.tokenizer",
    # features and attention pictures
    "embed": "bertkit.embeddings.features",
    "attention_map": "bertkit.explain.attention_view",
    "trace": "bertkit.explain.tracing",
    # model (config, encoder, task heads, checkpoints)
    "BertConfig": "bertkit.model.config",
    "BertModel": "bertkit.model.modeling",
    "accelerate": "bertkit.runtime.fast",
    "quantize": "bertkit.runtime.quantization",
    "reuse_freed_memory": "bertkit.runtime.allocator",
    "BertForPreTraining": "bertkit.model.heads",
    "BertForMaskedLM": "bertkit.model.heads",
    "BertForNextSentencePrediction": "bertkit.model.heads",
    "BertForSequenceClassification": "bertkit.model.heads",
    "BertForTokenClassification": "bertkit.model.heads",
    "BertForQuestionAnswering": "bertkit.model.heads",
    "BertForMultipleChoice": "bertkit.model.heads",
    # one way in for inference: a model directory -> the ready model and what it is
    "load": "bertkit.runtime.loading",
    # fine-tuning: use a fine-tuned model (training: bertkit.tasks.finetune)
    "predict": "bertkit.tasks.predict",
    # pre-training data (made by `bertkit pretrain prepare` / bertkit.pretraining.prepare.prepare)
    "PretrainingDataset": "bertkit.pretraining.dataset",
}

__all__ = ["BertkitError", "__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bertkit' has no attribute {name!r}")
