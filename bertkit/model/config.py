"""BertConfig: the shape and hyper-parameters of a BERT model, one typed dataclass.

The field names are the published ones (google-research/bert `BertConfig`,
Hugging Face `config.json`), so a `config.json` written by either loads here and
ours loads there. Presets give the shapes of the paper (base, large) and of
Google's "BERT miniatures" (tiny, mini, small, medium; Turc et al. 2019).

Fine-tuned heads also carry their labels the way Hugging Face stores them:
`num_labels`, `id2label` / `label2id` (JSON keys are strings there, ints here)
and `problem_type` ("regression", "single_label_classification",
"multi_label_classification"). One setting is bertkit's own:
`classifier_pooling`, the vector BertForSequenceClassification classifies,
"cls" (BERT's pooler, the default) or "mean" (the average of the last layer's
token vectors); transformers' BertForSequenceClassification knows only "cls",
so it is written to config.json only when it is "mean".

A config.json is checked before anything is built from it (`from_dict`, `validate`): each
known key must have its field's JSON type (`layer_norm_eps: "1e-12"` is refused naming the
key, not a TypeError later), the sizes must lie in SIZE_LIMITS (ranges far beyond any
published encoder: a `num_hidden_layers` of 10^6 would build layers until memory runs
out), and the whole must stay under MAX_PARAMETERS. A model folder's config is also checked
against its weights' shapes before allocation (`bertkit.model.weights_check`).

What we do not support (and say so when a config asks for it): decoders and
cross-attention (`is_decoder`, `add_cross_attention`), relative position
embeddings (`position_embedding_type` other than "absolute").
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.errors import BertkitError, int_at_least
from bertkit.default_model import default_model_dir

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
REGRESSION, SINGLE_LABEL, MULTI_LABEL = PROBLEM_TYPES
# the label of positions every loss skips (PyTorch's cross-entropy default and transformers' convention):
# padding, unmasked tokens in masked LM, word pieces after the first in NER
IGNORE_INDEX = -100
CLASSIFIER_POOLINGS = ("cls", "mean")


def problem_type_of(num_labels: int, named: str | None = None, float_labels: bool = False) -> str:
    """What a sequence classifier's outputs are (the loss it trains with, how its logits are read), the one rule:
    `named` (config.problem_type) when the config names one, else as transformers' BertForSequenceClassification
    decides in forward: one output -> regression; more, with float labels ([B, num_labels] of 0/1) -> multi-label;
    with integer labels, or none to look at (a saved model read for inference) -> single-label.

    The sequence head's loss, checkpoint.task_info (a Hugging Face checkpoint's task) and distillation's soft loss
    ask it, so a model is trained, read and distilled as one kind. Single-label over one output is refused, as
    transformers refuses it: a softmax over one logit is always 1, so its loss is 0 and the head never learns."""
    if named is None:
        return REGRESSION if num_labels == 1 else MULTI_LABEL if float_labels else SINGLE_LABEL
    if named not in PROBLEM_TYPES:
        raise BertkitError(f"BertConfig.problem_type {named!r} is unknown; use one of {PROBLEM_TYPES}")
    if named == SINGLE_LABEL and num_labels == 1:
        raise BertkitError(f"BertConfig.problem_type {SINGLE_LABEL!r} needs num_labels of 2 or more, got 1 (a "
                           "softmax over one output is always 1): use num_labels 2, or problem_type 'regression' "
                           "for one score")
    return named

# name -> (num_hidden_layers, hidden_size, num_attention_heads); intermediate is 4x hidden
PRESETS = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

# ELECTRA's discriminators (Clark et al. 2020, table 6; the released google/electra-*-discriminator), `--config
# electra-NAME` of `bertkit pretrain run --method electra`: name -> (num_hidden_layers, hidden_size,
# num_attention_heads, embedding_size, the generator's size as a fraction of the discriminator); intermediate 4x hidden.
# The generator sizes are table 6's (google-research/electra configure_pretraining.py: generator_hidden_size 0.25,
# 0.33333 for base); the released ELECTRA-Small's generator is as large as its discriminator (the repository's README).
ELECTRA_PRESETS = {
    "small": (12, 256, 4, 128, 1 / 4),
    "base": (12, 768, 12, 768, 1 / 3),
    "large": (24, 1024, 16, 1024, 1 / 4),
}
ELECTRA_PREFIX = "electra-"  # --config electra-small: ELECTRA_PRESETS["small"] (BERT's own "small" is 4 x 512)

# the largest size each field may take: far past any published encoder (BERT-large: 24 layers, hidden 1024,
# 512 positions; multilingual vocabularies ~250k), small enough that a typo cannot ask for terabytes
SIZE_LIMITS = {"vocab_size": 1 << 24, "hidden_size": 1 << 16, "num_hidden_layers": 1024, "num_attention_heads": 1 << 12,
               "intermediate_size": 1 << 18, "max_position_embeddings": 1 << 20, "type_vocab_size": 1 << 16,
               "num_labels": 1 << 20, "embedding_size": 1 << 16}
MAX_PARAMETERS = 20_000_000_000  # 80 GB of float32 weights

# Keys Hugging Face writes that mean nothing for an encoder-only BERT: read and dropped.
_HF_IGNORED = {
    "transformers_version", "model_type", "use_cache", "bos_token_id", "eos_token_id",
    "_name_or_path", "torch_dtype", "dtype", "output_past",
    "directionality", "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers",
    "pooler_size_per_head", "pooler_type", "return_dict", "output_hidden_states",
    "output_attentions", "chunk_size_feed_forward", "tokenizer_class", "finetuning_task",
    "_attn_implementation_autoset", "sep_token_id", "cls_token_id",
}


# bertkit's own settings (how to run, and the classifier's pooling): written to config.json only
# when changed, so a stock checkpoint stays as transformers writes it
_OURS = ("attn_implementation", "gradient_checkpointing", "classifier_pooling")


@dataclass
class BertConfig:
    """Every setting of a BERT model. Defaults are BERT-base (uncased vocabulary)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"  # the erf form, as in BERT
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # task heads
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    problem_type: str | None = None
    classifier_dropout: float | None = None  # None: use hidden_dropout_prob
    classifier_pooling: str = "cls"  # "cls": tanh pooler on [CLS] (BERT); "mean": average of the token vectors
    tie_word_embeddings: bool = True  # the masked-LM decoder is the word-embedding matrix (False: a matrix of its own)
    # how to run
    attn_implementation: str = "sdpa"  # "sdpa" (fused, default) or "eager" (explicit)
    gradient_checkpointing: bool = False  # recompute each layer in backward to save memory
    architectures: list[str] | None = None
    extra: dict = field(default_factory=dict)  # unknown config.json keys, kept for the round trip

    def __post_init__(self):
        check_types(type(self), {f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        if self.id2label is None and self.label2id is not None:
            self.id2label = {int(v): k for k, v in self.label2id.items()}
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)
            if self.label2id is None:
                self.label2id = {v: k for k, v in self.id2label.items()}
        if self.label2id is not None:
            self.label2id = {str(k): int(v) for k, v in self.label2id.items()}
        self.validate()

    # --- checks -------------------------------------------------------------

    def validate(self) -> None:
        """Raise BertkitError naming the first setting that cannot work."""
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size", "num_labels"):
            int_at_least(getattr(self, name), 1, f"BertConfig.{name}", says="a positive integer")
        for name, most in SIZE_LIMITS.items():
            if getattr(self, name, 0) > most:
                raise BertkitError(f"{type(self).__name__}.{name} is {getattr(self, name)}, over the limit of {most}: "
                                   "the config is probably corrupt (check config.json)")
        if self.parameters() > MAX_PARAMETERS:
            raise BertkitError(f"{type(self).__name__} describes {self.parameters():,} parameters, over the limit of "
                               f"{MAX_PARAMETERS:,}: check the sizes in config.json")
        if self.hidden_size % self.num_attention_heads:
            raise BertkitError(
                f"BertConfig.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads}): each head gets hidden_size / heads dimensions"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            p = getattr(self, name)
            if p is not None and not (0.0 <= p < 1.0):
                raise BertkitError(f"BertConfig.{name} must be in [0, 1), got {p!r}")
        if self.hidden_act not in ACTIVATIONS:
            raise BertkitError(f"BertConfig.hidden_act {self.hidden_act!r} is not supported; use one of {ACTIVATIONS}")
        if self.problem_type is not None:
            problem_type_of(self.num_labels, self.problem_type)  # a name it knows, that fits num_labels
        if self.classifier_pooling not in CLASSIFIER_POOLINGS:
            raise BertkitError(
                f"BertConfig.classifier_pooling {self.classifier_pooling!r} is unknown; use one of {CLASSIFIER_POOLINGS}"
            )
        if self.attn_implementation not in ("sdpa", "eager"):
            raise BertkitError(
                f"BertConfig.attn_implementation {self.attn_implementation!r} is unknown; use 'sdpa' or 'eager'"
            )
        if not (0 <= self.pad_token_id < self.vocab_size):
            raise BertkitError(f"BertConfig.pad_token_id {self.pad_token_id} is outside the vocabulary (size {self.vocab_size})")
        if self.layer_norm_eps <= 0 or self.initializer_range <= 0:
            raise BertkitError("BertConfig.layer_norm_eps and initializer_range must be positive")
        if self.id2label is not None and sorted(self.id2label) != list(range(len(self.id2label))):
            raise BertkitError(f"BertConfig.id2label must map 0..num_labels-1, got keys {sorted(self.id2label)}")

    def parameters(self) -> int:
        """About how many weights the encoder has (embeddings and layers; heads are small beside them)."""
        h, i = self.hidden_size, self.intermediate_size
        e = getattr(self, "embedding_size", h)
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * e + e * h
        return embeddings + self.num_hidden_layers * (4 * h * h + 2 * h * i)

    @property
    def head_size(self) -> int:
        """D: dimensions per attention head."""
        return self.hidden_size // self.num_attention_heads

    def problem_type_for(self, float_labels: bool = False) -> str:
        """The sequence classifier's problem type, named or decided (`problem_type_of`)."""
        return problem_type_of(self.num_labels, self.problem_type, float_labels)

    @property
    def labels(self) -> list[str]:
        """Label names by id (LABEL_i when the config names none, as Hugging Face does)."""
        if self.id2label:
            return [self.id2label[i] for i in range(self.num_labels)]
        return [f"LABEL_{i}" for i in range(self.num_labels)]

    # --- construction -------------------------------------------------------

    @classmethod
    def preset(cls, name: str, **overrides) -> "BertConfig":
        """A named shape: tiny/mini/small/medium (Google's miniatures), base, large.

        The feed-forward layer is 4x hidden, as in the paper; any field can be overridden.
        """
        if name not in PRESETS:
            raise BertkitError(f"unknown BertConfig preset {name!r}; choose one of {list(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        values = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      intermediate_size=4 * hidden)
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes) -> "BertConfig":
        """A copy with some fields changed (validated again)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise BertkitError(f"BertConfig has no field(s) {sorted(unknown)}")
        if "num_labels" in changes and "id2label" not in changes and self.id2label is not None:
            if changes["num_labels"] != len(self.id2label):  # the old names no longer fit
                changes.update(id2label=None, label2id=None)
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict) -> "BertConfig":
        """Build from a Hugging Face style dict; HF-only keys are dropped, unknown ones kept in `extra`."""
        if not isinstance(values, dict):  # dict([]) is {}: a list would silently give the defaults
            raise BertkitError(f"a config must be a dict of settings, got {type(values).__name__}")
        values = dict(values)
        if values.get("model_type", "bert") != "bert":
            raise BertkitError(f"this config is for model_type {values['model_type']!r}, not 'bert'")
        if values.pop("is_decoder", False) or values.pop("add_cross_attention", False):
            raise BertkitError("decoder BERT configs (is_decoder / add_cross_attention) are not supported")
        pos = values.pop("position_embedding_type", "absolute")
        if pos != "absolute":
            raise BertkitError(f"position_embedding_type {pos!r} is not supported (only 'absolute')")
        if "_attn_implementation" in values:
            values.setdefault("attn_implementation", values.pop("_attn_implementation"))
        names = {f.name for f in dataclasses.fields(cls)}
        extra = dict(values.pop("extra", {}) or {})
        for key in list(values):
            if key in _HF_IGNORED:
                values.pop(key)
            elif key not in names:
                extra[key] = values.pop(key)
        if values.get("attn_implementation") not in (None, "sdpa", "eager"):
            values.pop("attn_implementation")  # e.g. "flash_attention_2" written by HF on a GPU
        try:
            return cls(**values, extra=extra)
        except TypeError as err:  # a field of the wrong type, e.g. a string where an int belongs
            raise BertkitError(f"invalid BERT config: {err}") from None

    def to_dict(self) -> dict:
        """A Hugging Face compatible dict (id2label keys as strings, like config.json)."""
        out = {"model_type": "bert"}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra":
                continue
            if f.name == "id2label":
                value = {str(k): v for k, v in (value or {i: l for i, l in enumerate(self.labels)}).items()}
            if f.name == "label2id":
                value = value or {l: i for i, l in enumerate(self.labels)}
            if f.name in ("architectures", "problem_type") and value is None:
                continue
            if (f.name in _OURS or f.name == "tie_word_embeddings") and value == f.default:
                continue  # written only when changed: a stock checkpoint stays as transformers writes it
            out[f.name] = value
        out["position_embedding_type"] = "absolute"
        out.update(self.extra)
        return out

    @classmethod
    def from_json_file(cls, path) -> "BertConfig":
        path = Path(path)
        if not path.is_file():
            raise BertkitError(f"no config file at {path}")
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise BertkitError(f"{path} is not valid JSON ({err}); re-save the config") from None
        if not isinstance(values, dict):
            raise BertkitError(f"{path} must hold a JSON object")
        return cls.from_file_dict(values, path)

    @classmethod
    def from_file_dict(cls, values: dict, path) -> "BertConfig":
        """`from_json_file` of the object a caller read from the config file at `path` (read once for all it asks)."""
        config = cls.from_dict(values)  # its types checked first
        _check_label_count(values, config, path)
        return config

    def to_json_string(self) -> str:
        """config.json's text (sorted keys, a final newline)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path) -> None:
        """Write the config to `path` as it stands (a model folder's config.json is written whole or not at
        all by `bertkit.model.checkpoint.save_config`)."""
        Path(path).write_text(self.to_json_string(), encoding="utf-8")

    @classmethod
    def from_pretrained(cls, path=None) -> "BertConfig":
        """The config.json of a model directory (None: the default model)."""
        if path is None:
            path = default_model_dir()
        path = Path(path)
        return cls.from_json_file(path / "config.json" if path.is_dir() else path)


def _check_label_count(values: dict, config: BertConfig, path: Path) -> None:
    """config.json's num_labels beside an id2label (or a label2id alone) of another count: refused, naming both.
    The names won here (`BertConfig.__post_init__`: num_labels 3 beside two names predicted two labels, silently),
    transformers 5.x reads num_labels (LABEL_0... or a size mismatch) and 4.x the names: which outputs the labels
    are is not known. Neither library writes such a file (transformers writes no num_labels): a hand edit does."""
    which = "id2label" if values.get("id2label") is not None else "label2id"
    count = values.get("num_labels")
    if count is not None and values.get(which) and count != config.num_labels:  # config's: the names' count
        names = config.labels
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise BertkitError(f"{path}: num_labels is {count} but its {which} names {len(names)} "
                           f"label{'s' if len(names) != 1 else ''} ({shown}): make them agree (one name per output "
                           "of the classifier), or remove num_labels")


def _json_kind(value) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object",
            type(None): "null"}.get(type(value), type(value).__name__)


def _fits(value, hint) -> bool:
    """Whether a JSON value has the type a field's annotation asks for (int is not bool; int fits float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(v, args[1]) for v in value.values())
    return isinstance(value, hint)


def check_types(cls, values: dict) -> None:
    """Refuse, naming the key, a config value whose JSON type is not its field's (before any arithmetic on it);
    id2label's keys must be whole numbers ("0", "1", ...), as transformers writes them."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in values or f.name == "extra":
            continue
        value, hint = values[f.name], hints[f.name]
        if f.name == "id2label" and isinstance(value, dict):
            bad = [k for k in value if isinstance(k, bool) or not (isinstance(k, int) or str(k).strip().lstrip("-").isdigit())]
            if bad:
                raise BertkitError(f"config id2label has the key {bad[0]!r}: its keys must be label ids 0, 1, 2...")
            hint = dict[str, str]
        if f.name == "label2id":
            hint = dict[str, int] | None
        if not _fits(value, hint):
            raise BertkitError(f"config {f.name} must be {_type_words(hint)}, got {json.dumps(value)[:60]} "
                               f"({_json_kind(value)}): fix config.json")


def _type_words(hint) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) else hint
    words = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}
    if base in words:
        return words[base]
    origin = typing.get_origin(base)
    return {list: "a list of strings", dict: "an object"}.get(origin, getattr(base, "__name__", str(base)))
