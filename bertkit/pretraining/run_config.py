"""The settings of one pre-training run, defined once: a typed dataclass.

`bertkit pretrain run` builds its flags from these fields (`bertkit.options`),
the run writes them to OUT/run_config.json, and `--resume` reads them back with
the flags given on top, so every setting has one name, one type, one default
and one help text. Names
follow the published ones (google-research/bert `run_pretraining.py`,
transformers `TrainingArguments`): `train_batch_size` there is our
`batch_size * grad_accum * world_size`.

The optimiser fields live in `bertkit.training.optim.OptimConfig` (shared with
fine-tuning); the pre-training defaults differ from the fine-tuning ones the
way BERT's did: peak rate 1e-4, warm-up 1% of the steps, Adam epsilon 1e-6.
An ELECTRA preset (`--config electra-small|base|large`) runs at the ELECTRA
paper's settings instead where no flag is given (`ELECTRA_RUNS`, `preset_defaults`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import ClassVar
from pathlib import Path

from bertkit.errors import BertkitError, bool_settings, positive
from bertkit.training import PRECISIONS, paths_as_text
from bertkit.training.optim import OptimConfig
from bertkit.model.config import ELECTRA_PREFIX, ELECTRA_PRESETS, PRESETS

OPTIMIZERS = ("adamw", "lamb")
METHODS = ("bert", "electra")

# how each method shows a masked token, (mask_replace_prob, random_replace_prob); the rest keep their token.
# BERT (Devlin et al. 2019, section 3.1; google-research/bert create_pretraining_data.py): 80% [MASK], 10% a random
# token, 10% kept. ELECTRA (google-research/electra pretrain/pretrain_helpers.py `mask`: [MASK] where
# `tf.random.uniform([B, N]) < 0.85`, the original elsewhere): 85% [MASK], 15% kept, no random token (the generator's
# samples are the replacements). transformers' DataCollatorForLanguageModeling names the two shares so.
REPLACEMENT = {"bert": (0.8, 0.1), "electra": (0.85, 0.0)}


# google-research/electra configure_pretraining.py, per model_size: "small" its own values (learning_rate 5e-4,
# train_batch_size 128), "base" and "large" its commented block "see Table 6 in the paper" (2e-4; 256 and 2048);
# each num_warmup_steps 10000 of num_train_steps 1,000,000 (1%, a ratio here: a run's --max-steps is its own) and
# weight_decay_rate 0.01, and model/optimization.py's Adam epsilon 1e-6: BERT's pre-training values, written out
# so that each preset says all it runs at. Its train_batch_size is the whole update's, here --batch-size, one
# process's micro-batch (under torchrun N processes make N x it). The sequence length (128; 512 for base and
# large) and large's mask_prob 0.25 are the data's: `bertkit pretrain prepare --max-seq-length/--masked-lm-prob`.
_ELECTRA_OPTIM = {"warmup_ratio": 10_000 / 1_000_000, "weight_decay": 0.01, "adam_epsilon": 1e-6}
ELECTRA_RUNS = {
    "small": {"batch_size": 128, "optim": {"learning_rate": 5e-4, **_ELECTRA_OPTIM}},
    "base": {"batch_size": 256, "optim": {"learning_rate": 2e-4, **_ELECTRA_OPTIM}},
    "large": {"batch_size": 2048, "optim": {"learning_rate": 2e-4, **_ELECTRA_OPTIM}},
}
_RUN_FLAGS = (("--learning-rate", "learning_rate"), ("--batch-size", "batch_size"), ("--warmup-ratio", "warmup_ratio"),
              ("--weight-decay", "weight_decay"), ("--adam-epsilon", "adam_epsilon"))


def pretraining_optim() -> OptimConfig:
    return OptimConfig(learning_rate=1e-4, warmup_ratio=0.01, adam_epsilon=1e-6)


@dataclass
class RunConfig:
    """One pre-training run. `data` and `output` are directories."""

    # settings added since runs were saved: what a run_config.json without them ran with (an ELECTRA run of before
    # its 85/0/15 masked 80/10/10, and goes on so on --resume)
    ADDED_FIELDS: ClassVar[dict] = {"mask_replace_prob": 0.8, "random_replace_prob": 0.1}

    data: str = field(metadata={"help": "a directory made by `bertkit pretrain prepare`", "positional": True,
                                "path": True})
    output: str = field(default="runs/pretrain", metadata={"help": "run directory: checkpoints, metrics, final model", "short": "-o"})
    config: str = field(default="tiny", metadata={"help": "model preset (tiny|mini|small|medium|base|large: BERT's shapes), electra-small|electra-base|electra-large (the ELECTRA paper's discriminators, --method electra; each also sets the paper's --learning-rate, --batch-size, warm-up, weight decay and Adam epsilon where not given) or a config.json (electra: also an ELECTRA one, its embedding_size kept)",
                                                  "needs": ("init_from", False)})
    method: str = field(default="bert", metadata={"help": "bert: masked LM (+ NSP/SOP if the data has pairs); electra: replaced-token detection, a generator 1/4 the size fills the masks and the model (the discriminator) spots the replaced tokens (data: --objective none)", "choices": METHODS})
    generator_size: float | None = field(default=None, metadata={"help": "electra: the generator's size as a fraction of the discriminator's (heads, hidden and feed-forward; whole heads of the discriminator's head size, at least one: the run says where that rounds); default 1/3 for electra-base, else 1/4 (the paper's table 6)",
                                                         "needs": [("method", "electra"), ("init_from", False)]})
    disc_weight: float = field(default=50.0, metadata={"help": "electra: loss = generator MLM loss + this x discriminator loss",
                                                     "needs": ("method", "electra")})
    mask_replace_prob: float | None = field(default=None, metadata={"help": "share of the masked tokens shown as [MASK] (default: the method's, bert 0.8, electra 0.85 as google-research/electra)"})
    random_replace_prob: float | None = field(default=None, metadata={"help": "share shown as a random token (default: bert 0.1, electra 0); the rest keep their token"})
    init_from: str | None = field(default=None, metadata={"help": "continue pre-training a Hugging Face checkpoint (its config and weights replace --config; optimizer and schedule start fresh), e.g. on in-domain text", "path": True})
    max_steps: int = field(default=1000, metadata={"resumable": True, "help": "optimizer updates to train for"})
    batch_size: int = field(default=32, metadata={"help": "sequences per micro-batch, per process"})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches accumulated into one update"})
    optimizer: str = field(default="adamw", metadata={"help": "adamw, or lamb for very large batches", "choices": OPTIMIZERS})
    precision: str = field(default="fp32", metadata={"help": "fp32, bf16 (autocast, CPU or GPU) or fp16 (GradScaler, GPU only)", "choices": PRECISIONS})
    compile: bool = field(default=False, metadata={"resumable": True,  # the same arithmetic, compiled or not
                                                   "help": "wrap the model in torch.compile"})
    fsdp: bool = field(default=False, metadata={"help": "under torchrun: shard the model with FSDP instead of DDP"})
    dropout: float | None = field(default=None, metadata={"help": "override hidden and attention dropout (0 for exact comparisons); written into the saved config.json, so a fine-tuning from it runs at this dropout too"})
    seed: int = field(default=42, metadata={"help": "seeds weights, data order, masking and dropout"})
    save_every: int = field(default=500, metadata={"resumable": True, "help": "checkpoint every N steps (and always at the end)"})
    keep_last: int = field(default=3, metadata={"resumable": True, "help": "checkpoints to keep"})
    eval_every: int = field(default=200, metadata={"resumable": True, "help": "evaluate on the held-out slice every N steps (0: never)"})
    eval_sequences: int = field(default=256, metadata={"help": "sequences held out from training for evaluation",
                                                       "needs": ("eval_every", None)})
    log_every: int = field(default=1, metadata={"resumable": True, "help": "write a metrics line every N steps"})
    resume: bool = field(default=False, metadata={"help": "continue from OUTPUT's last checkpoint"})
    overwrite: bool = field(default=False, metadata={
        "help": "replace what OUTPUT already holds (a model or a run); without it such a folder is refused"})
    device: str = field(default="auto", metadata={"resumable": True, "help": "where to train: auto picks a CUDA GPU when there is one", "choices": ("auto", "cpu", "cuda")})
    optim: OptimConfig = field(default_factory=pretraining_optim)

    @staticmethod
    def preset_defaults(values: dict) -> dict:
        """The run settings an ELECTRA preset takes where no flag is given (`bertkit.options.from_args`): its
        ELECTRA_RUNS row; none for another --config (BERT's shapes keep BERT's) or one continued (--init-from)."""
        preset = electra_preset(values.get("config") or "")
        electra = preset and values.get("method") == "electra" and not values.get("init_from")
        return ELECTRA_RUNS[preset] if electra else {}

    def __post_init__(self):
        paths_as_text(self)  # a notebook's pathlib.Path, held as the command line's str
        bool_settings(self)  # "false" is a true str

    def validate(self) -> "RunConfig":
        for name in ("max_steps", "batch_size", "grad_accum", "save_every", "keep_last", "log_every"):
            if getattr(self, name) < 1:
                raise BertkitError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "eval_sequences"):
            if getattr(self, name) < 0:
                raise BertkitError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.optimizer not in OPTIMIZERS:
            raise BertkitError(f"unknown optimizer {self.optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
        if self.precision not in PRECISIONS:
            raise BertkitError(f"unknown precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.method not in METHODS:
            raise BertkitError(f"unknown method {self.method!r}: choose one of {', '.join(METHODS)}")
        if not self.resume and not self.init_from and electra_preset(self.config) and self.method != "electra":
            raise BertkitError(electra_only(self.config))
        if self.generator_size is not None and not 0 < self.generator_size <= 1:
            raise BertkitError(f"--generator-size is a fraction of the discriminator in (0, 1], got {self.generator_size}")
        positive(self.disc_weight, "--disc-weight")
        shown_as_mask, shown_random = self.replacement()
        if not (0 <= shown_as_mask <= 1 and 0 <= shown_random <= 1 and shown_as_mask + shown_random <= 1):
            raise BertkitError(f"--mask-replace-prob {shown_as_mask:g} and --random-replace-prob {shown_random:g} are "
                               "shares of the masked tokens: each in [0, 1], together at most 1")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise BertkitError(f"--dropout must be in [0, 1), got {self.dropout}")
        self.optim.validate()
        from bertkit.training.loop import check_device  # here: it needs torch, the settings do not

        check_device(self.device, self.precision)
        # a resumed run takes the architecture its checkpoint recorded: --init-from and --config may be gone
        if not self.resume and self.init_from is not None and not Path(self.init_from).is_dir():
            raise BertkitError(f"--init-from {self.init_from} does not exist: name the folder of the checkpoint to "
                               "continue (config.json, model.safetensors, vocab.txt)")
        if not self.resume and not self.init_from:
            if self.config not in PRESETS and electra_preset(self.config) is None and not Path(self.config).is_file():
                raise BertkitError(f"--config {self.config!r} is neither a preset ({', '.join(PRESETS)}; with --method "
                                   f"electra also {', '.join(ELECTRA_PREFIX + n for n in ELECTRA_PRESETS)}) "
                                   "nor a config.json file")
        return self

    def generator_fraction(self) -> float:
        """--generator-size, else the ELECTRA preset's (1/3 for electra-base, the paper's table 6), else 1/4."""
        if self.generator_size is not None:
            return self.generator_size
        preset = electra_preset(self.config)
        return ELECTRA_PRESETS[preset][4] if preset else 0.25

    def replacement(self) -> tuple[float, float]:
        """(mask_replace_prob, random_replace_prob): the flags given, else the method's (REPLACEMENT)."""
        shown_as_mask, shown_random = REPLACEMENT[self.method]
        return (shown_as_mask if self.mask_replace_prob is None else self.mask_replace_prob,
                shown_random if self.random_replace_prob is None else self.random_replace_prob)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def electra_preset(config: str) -> str | None:
    """The ELECTRA_PRESETS name `--config electra-NAME` names (None: another --config)."""
    name = config.removeprefix(ELECTRA_PREFIX)
    return name if config.startswith(ELECTRA_PREFIX) and name in ELECTRA_PRESETS else None


def preset_note(cfg: RunConfig) -> str | None:
    """The line a run of an ELECTRA preset prints: each run setting ELECTRA_RUNS sets, and whose it is."""
    preset = electra_preset(cfg.config)
    if not preset or cfg.method != "electra" or cfg.init_from:
        return None
    wanted = ELECTRA_RUNS[preset]
    parts = []
    for flag, name in _RUN_FLAGS:
        ours, theirs = (cfg.batch_size, wanted["batch_size"]) if name == "batch_size" else (
            getattr(cfg.optim, name), wanted["optim"][name])
        parts.append(f"{flag} {ours:g} ({cfg.config}'s)" if ours == theirs else
                     f"{flag} {ours:g} (given; {cfg.config}'s {theirs:g})")
    return (f"{cfg.config} runs at google-research/electra's settings (configure_pretraining.py) unless a flag says "
            f"otherwise: {', '.join(parts)}")


def electra_only(config: str) -> str:
    """The refusal of an ELECTRA preset in a BERT run (its embeddings are narrower than its layers, which BERT's
    config cannot say)."""
    return (f"--config {config} is the ELECTRA paper's discriminator: pre-train it with --method electra, or give one "
            f"of BERT's shapes ({', '.join(PRESETS)})")
