"""The settings of `bertkit distill`: typed dataclasses, the command-line options built from them.

No torch here: `bertkit --help` builds every option without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Literal

from bertkit.errors import BertkitError, bool_settings, positive, probability, refuse_unneeded
from bertkit.tasks.config import TrainConfig, paths_as_text  # bertkit.training's, as tasks hold it

HOLDOUT_METRICS = {"holdout_mse": False, "holdout_cosine": True}  # what picks the epoch (--holdout): higher better?


@dataclass(frozen=True)
class StaticDistillConfig:
    """`bertkit distill static`: Model2Vec's recipe (see bertkit.distill.static)."""

    dim: int = field(default=256, metadata={"help": "dimensions kept by PCA (at most the model's width)"})
    corpus: list[str] | None = field(default=None, metadata={
        "help": "text files (one text per line, or .tsv/.jsonl): token frequencies for the weights, and its "
        "frequent whole words added to the vocabulary"})
    sif_coefficient: float = field(default=1e-4, metadata={
        "help": "SIF weight a / (a + p(token)); p from the corpus, else Zipf's law over the vocabulary order"})
    max_words: int = field(default=10000, metadata={"help": "with --corpus: at most this many whole words added"})
    min_count: int = field(default=5, metadata={"help": "with --corpus: a word is added when seen this often"})
    batch_size: int = field(default=512, metadata={"help": "tokens per forward pass"})
    max_length: int = field(default=512, metadata={
        "help": "tokens a text is cut at when the static model embeds it (model2vec's default; written as "
        "tokenizer.json's truncation, which sentence-transformers follows); 0: never cut"})
    dtype: Literal["float32", "bfloat16", "auto"] = field(default="float32", metadata={
        "help": "the teacher's precision while distilling"})
    fit: str | None = field(default=None, metadata={
        "help": "a text file (one text per line, or .tsv/.jsonl): after distilling, train the table so each "
        "text's mean row points where the model's sentence vector does (cosine; Tokenlearn's idea)"})
    fit_epochs: float = field(default=3.0, metadata={"help": "with --fit: passes over its texts"})
    fit_learning_rate: float = field(default=0.03, metadata={
        "help": "with --fit: the peak rate (AdamW, warm-up and linear decay, no weight decay)"})
    fit_batch_size: int = field(default=256, metadata={"help": "with --fit: texts per update"})
    seed: int = field(default=0, metadata={"help": "with --fit: seeds the order of its texts"})
    teacher_dtype: Literal["float32", "bfloat16", "auto"] = field(default="float32", metadata={
        "help": "with --fit: the precision the model's vectors of its texts are computed in (auto: bf16 where native)"})
    teacher_cache: str | None = field(default=None, metadata={
        "help": "with --fit: a .safetensors file for the model's vectors of its texts, read when it holds those "
        "of these texts and model, else written (a rerun then skips the model)"})
    overwrite: bool = field(default=False, metadata={
        "help": "replace the folder an earlier run wrote at -o (without it a folder that holds anything is refused)"})

    def __post_init__(self):
        bool_settings(self)  # overwrite="false" is a true str: it replaced the folder

    def fit_training(self, progress: bool = True) -> TrainConfig:
        """The training loop's settings of the --fit stage."""
        base = TrainConfig()
        return replace(base, epochs=self.fit_epochs, batch_size=self.fit_batch_size, seed=self.seed, progress=progress,
                       optim=replace(base.optim, learning_rate=self.fit_learning_rate, weight_decay=0.0))

    def validate(self) -> None:
        refuse_unneeded(STATIC_NEEDS, changed(self), {"fit": self.fit, "corpus": self.corpus})
        if not self.fit_epochs > 0 or not self.fit_learning_rate > 0 or self.fit_batch_size < 1:
            raise BertkitError("--fit-epochs and --fit-learning-rate must be > 0, --fit-batch-size >= 1")
        if self.dim < 1:
            raise BertkitError(f"--dim must be at least 1, got {self.dim}")
        if not 0 < self.sif_coefficient < 1:
            raise BertkitError(f"--sif-coefficient must be in (0, 1), got {self.sif_coefficient}")
        if self.max_words < 0 or self.min_count < 1 or self.batch_size < 1 or self.max_length < 0:
            raise BertkitError("--max-words and --max-length must be >= 0, --min-count and --batch-size >= 1")


def changed(config) -> dict:
    """The settings of `config` that differ from its class's defaults: what a caller of the library gave (the
    command line's flags are among them)."""
    return {f.name: getattr(config, f.name) for f in fields(config) if getattr(config, f.name) != f.default}


def _flags(*names: str) -> list[dict]:
    return [{name: "--" + name.replace("_", "-")} for name in names]


# a setting of a stage that does not run is read by nothing: the run went on as if it were not given
# (`bertkit.errors.refuse_unneeded`; checked by `validate`, on the settings that differ from the defaults)
FIT_SAYS = "{given} applies to --fit, which was not given: give --fit FILE too, or leave {flags} out"
CORPUS_SAYS = "{given} applies to --corpus, which was not given: give --corpus FILE too, or leave {flags} out"
STATIC_NEEDS = [
    ({"teacher_cache": "--teacher-cache"}, ("fit", None), "{flags} keeps the vectors of the --fit texts: give --fit "
     "FILE too"),
    *[(flag, ("fit", None), FIT_SAYS) for flag in _flags("fit_epochs", "fit_learning_rate", "fit_batch_size", "seed",
                                                        "teacher_dtype")],
    *[(flag, ("corpus", None), CORPUS_SAYS) for flag in _flags("max_words", "min_count")],
]


@dataclass
class LayersDistillConfig:
    """`bertkit distill layers`: a student of --keep evenly spaced teacher layers (see bertkit.distill.layers)."""

    keep: int | None = field(default=None, metadata={"help": "teacher layers the student keeps", "required": True})
    data: str | None = field(default=None, metadata={
        "help": "what to match the teacher on: a sentence model's sentences, one per line (or .tsv/.jsonl); a "
        "fine-tuned model's inputs, read as `bertkit predict` reads them (the table it was trained on: its "
        "labels join the loss)", "required": True, "path": True})
    output: str | None = field(default=None, metadata={"help": "the student's folder", "short": "-o",
                                                        "required": True})
    temperature: float = field(default=2.0, metadata={
        "help": "a fine-tuned model: both logits divided by this before the KL (DistilBERT's soft loss, x T^2)"})
    soft_weight: float = field(default=0.5, metadata={
        "help": "a fine-tuned model, data with labels: the soft loss's share; the labels' loss gets the rest"})
    teacher_dtype: Literal["float32", "bfloat16", "auto"] = field(default="float32", metadata={
        "help": "a sentence model: the precision its target vectors are computed in (auto: bf16 where native)"})
    teacher_cache: str | None = field(default=None, metadata={"resumable": True, "path": True,
        "help": "a sentence model: a .safetensors file for its target vectors, read when it holds those of this "
        "data and teacher, else written (a rerun or --resume then skips the teacher)"})
    loss: Literal["mse", "mse+cosine"] = field(default="mse", metadata={
        "help": "a sentence model: what the student minimises, the MSE to the teacher's vectors "
        "(sentence-transformers' distillation) or that plus 1 - their cosine (the direction retrieval ranks by)"})
    holdout: int = field(default=0, metadata={
        "help": "a sentence model: this many sentences (a seeded draw) kept out of training; after each epoch the "
        "student's MSE to the teacher's vectors on them picks the epoch saved (--metric holdout_cosine: the "
        "mean cosine); 0: no held-out set, the last epoch is saved"})
    training: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self):
        paths_as_text(self)  # a notebook's pathlib.Path, held as the command line's str

    def validate(self) -> "LayersDistillConfig":
        if self.keep is None or self.data is None or self.output is None:
            raise BertkitError("--keep, --data and -o/--output are required")
        if self.keep < 1:
            raise BertkitError(f"--keep {self.keep}: keep at least 1 layer")
        positive(self.temperature, "--temperature", " (DistilBERT: 2)")
        probability(self.soft_weight, "--soft-weight")
        if self.holdout < 0:
            raise BertkitError(f"--holdout must be >= 0 (0: no held-out sentences), got {self.holdout}")
        metric = self.training.metric  # without --holdout it was never read
        if metric is not None and metric not in HOLDOUT_METRICS:
            raise BertkitError(f"--metric {metric!r}: with --holdout choose one of {', '.join(HOLDOUT_METRICS)}")
        if metric is not None and not self.holdout:
            raise BertkitError(f"--metric {metric} picks the epoch saved by its score on the --holdout sentences: "
                               "give --holdout N too, or leave --metric out (without it the last epoch is saved)")
        self.training.validate()
        return self


# the settings of one kind of teacher, which the other kind never reads: the run went on as if they were not
# given (a fine-tuned teacher's logits ran in float32 whatever --teacher-dtype said, no cache file was written,
# --loss was not its soft loss; a sentence model's MSE has no temperature or soft share). Checked once the
# teacher is loaded (`distill_layers`), on the settings that differ from the defaults ("fine_tuned": its kind)
VECTORS_SAYS = ("{given} is for a sentence model's vectors; a fine-tuned teacher's logits are computed in float32 each "
                "run and learnt by the soft loss: leave it out")
LOGITS_SAYS = ("{given} is for a fine-tuned teacher's logits; {teacher} is a sentence model, whose vectors the student "
               "learns by --loss: leave it out")
TEACHER_NEEDS = [
    ({"holdout": "--holdout"}, ("fine_tuned", False), "{flags} is for a sentence model's sentences; a fine-tuned "
     "teacher's student is trained on its table: leave {flags} out"),
    *[(flag, ("fine_tuned", False), VECTORS_SAYS) for flag in _flags("teacher_dtype", "teacher_cache", "loss")],
    *[(flag, ("fine_tuned", None), LOGITS_SAYS) for flag in _flags("temperature", "soft_weight")],
]
