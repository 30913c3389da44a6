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
    "Tokenizer": "bertkit.tokenizer",
    # features and attention pictures
    "embed": "bertkit.features",
    "attention_map": "bertkit.attention_view",
    "trace": "bertkit.tracing",
    # model (config, encoder, task heads, checkpoints)
    "BertConfig": "bertkit.config",
    "BertModel": "bertkit.modeling",
    "accelerate": "bertkit.fast",
    "quantize": "bertkit.quantization",
    "reuse_freed_memory": "bertkit.allocator",
    "BertForPreTraining": "bertkit.heads",
    "BertForMaskedLM": "bertkit.heads",
    "BertForNextSentencePrediction": "bertkit.heads",
    "BertForSequenceClassification": "bertkit.heads",
    "BertForTokenClassification": "bertkit.heads",
    "BertForQuestionAnswering": "bertkit.heads",
    "BertForMultipleChoice": "bertkit.heads",
    # one way in for inference: a model directory -> the ready model and what it is
    "load": "bertkit.loading",
    # fine-tuning: use a fine-tuned model (training: bertkit.finetune.finetune)
    "predict": "bertkit.finetune.predict",
    # pre-training data (made by `bertkit pretrain prepare` / bertkit.pretraining.prepare.prepare)
    "PretrainingDataset": "bertkit.pretraining.dataset",
}

__all__ = ["BertkitError", "__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bertkit' has no attribute {name!r}")
