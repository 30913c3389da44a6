"""The settings of one pre-training run, defined once: a typed dataclass.

`bertkit pretrain run` builds its flags from these fields (`add_arguments`),
the run writes them to OUT/run_config.json, and `--resume` reads them back, so
every setting has one name, one type, one default and one help text. Names
follow the published ones (google-research/bert `run_pretraining.py`,
transformers `TrainingArguments`): `train_batch_size` there is our
`batch_size * grad_accum * world_size`.

The optimiser fields live in `bertkit.training.optim.OptimConfig` (shared with
fine-tuning); the pre-training defaults differ from the fine-tuning ones the
way BERT's did: peak rate 1e-4, warm-up 1% of the steps, Adam epsilon 1e-6.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.training.optim import SCHEDULES, OptimConfig

OPTIMIZERS = ("adamw", "lamb")
PRECISIONS = ("fp32", "bf16", "fp16")


def pretraining_optim() -> OptimConfig:
    return OptimConfig(learning_rate=1e-4, warmup_ratio=0.01, adam_epsilon=1e-6)


@dataclass
class RunConfig:
    """One pre-training run. `data` and `output` are directories."""

    data: str = field(metadata={"help": "a directory made by `bertkit pretrain prepare`", "positional": True})
    output: str = field(default="runs/pretrain", metadata={"help": "run directory: checkpoints, metrics, final model", "short": "-o"})
    config: str = field(default="tiny", metadata={"help": "model preset (tiny|mini|small|medium|base|large) or a config.json"})
    init_from: str | None = field(default=None, metadata={"help": "continue pre-training a Hugging Face checkpoint (its config and weights replace --config; optimizer and schedule start fresh), e.g. on in-domain text"})
    max_steps: int = field(default=1000, metadata={"help": "optimizer updates to train for"})
    batch_size: int = field(default=32, metadata={"help": "sequences per micro-batch, per process"})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches accumulated into one update"})
    optimizer: str = field(default="adamw", metadata={"help": "adamw, or lamb for very large batches", "choices": OPTIMIZERS})
    precision: str = field(default="fp32", metadata={"help": "fp32, bf16 (autocast, CPU or GPU) or fp16 (GradScaler, GPU only)", "choices": PRECISIONS})
    compile: bool = field(default=False, metadata={"help": "wrap the model in torch.compile"})
    fsdp: bool = field(default=False, metadata={"help": "under torchrun: shard the model with FSDP instead of DDP"})
    dropout: float | None = field(default=None, metadata={"help": "override hidden and attention dropout (0 for exact comparisons)"})
    seed: int = field(default=42, metadata={"help": "seeds weights, data order, masking and dropout"})
    save_every: int = field(default=500, metadata={"help": "checkpoint every N steps (and always at the end)"})
    keep_last: int = field(default=3, metadata={"help": "checkpoints to keep"})
    eval_every: int = field(default=200, metadata={"help": "evaluate on the held-out slice every N steps (0: never)"})
    eval_sequences: int = field(default=256, metadata={"help": "sequences held out from training for evaluation"})
    log_every: int = field(default=1, metadata={"help": "write a metrics line every N steps"})
    resume: bool = field(default=False, metadata={"help": "continue from OUTPUT's last checkpoint"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda, or auto"})
    optim: OptimConfig = field(default_factory=pretraining_optim)

    def validate(self) -> "RunConfig":
        positive = ("max_steps", "batch_size", "grad_accum", "save_every", "keep_last", "log_every")
        for name in positive:
            if getattr(self, name) < 1:
                raise BertkitError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.eval_every < 0 or self.eval_sequences < 0:
            raise BertkitError("--eval-every and --eval-sequences must be >= 0")
        if self.optimizer not in OPTIMIZERS:
            raise BertkitError(f"unknown optimizer {self.optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
        if self.precision not in PRECISIONS:
            raise BertkitError(f"unknown precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise BertkitError(f"--dropout must be in [0, 1), got {self.dropout}")
        self.optim.validate()
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        d = dict(d)
        d["optim"] = OptimConfig(**d.get("optim", {}))
        return cls(**d)

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path) -> "RunConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))


# --- the command line, built from the fields above --------------------------

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _fields(cls):
    """(field, owner) for RunConfig's fields, with OptimConfig's flattened in."""
    for f in dataclasses.fields(cls):
        if f.name == "optim":
            yield from ((g, "optim") for g in dataclasses.fields(OptimConfig))
        else:
            yield f, None


OPTIM_HELP = {
    "learning_rate": "peak learning rate, reached after warm-up",
    "weight_decay": "decoupled weight decay (not on biases and LayerNorm)",
    "warmup_ratio": "fraction of --max-steps spent warming up linearly from 0",
    "schedule": "decay after warm-up: linear, cosine or constant",
    "adam_beta1": "first-moment decay (AdamW and LAMB)",
    "adam_beta2": "second-moment decay (AdamW and LAMB)",
    "adam_epsilon": "added to the second-moment root (AdamW and LAMB)",
    "max_grad_norm": "clip the global gradient norm to this; 0 disables",
}


def add_arguments(parser) -> None:
    """One argparse option per field; defaults are left to the dataclass."""
    defaults = {**pretraining_optim().__dict__}
    for f, owner in _fields(RunConfig):
        help_text = f.metadata.get("help", "") if owner is None else OPTIM_HELP.get(f.name, f.name.replace("_", " "))
        if f.metadata.get("positional"):
            parser.add_argument(f.name, help=help_text)
            continue
        default = defaults[f.name] if owner else f.default
        if default is not dataclasses.MISSING:
            help_text += f" (default: {default})"
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        flags = [_flag(f.name)] + ([f.metadata["short"]] if "short" in f.metadata else [])
        if kind == "bool":
            parser.add_argument(*flags, action="store_true", default=None, help=help_text)
        else:
            convert = {"int": int, "float": float, "str": str, "float | None": float, "str | None": str}[kind]
            choices = f.metadata.get("choices") or (SCHEDULES if f.name == "schedule" else None)
            parser.add_argument(*flags, type=convert, default=None, choices=choices, help=help_text)


def from_args(args) -> RunConfig:
    """A RunConfig from parsed arguments: only the flags given override defaults."""
    given = {f.name: getattr(args, f.name) for f, _ in _fields(RunConfig) if getattr(args, f.name, None) is not None}
    optim_names = {f.name for f in dataclasses.fields(OptimConfig)}
    optim = pretraining_optim()
    for name in optim_names & given.keys():
        setattr(optim, name, given.pop(name))
    return RunConfig(**given, optim=optim)
