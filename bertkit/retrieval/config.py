"""The settings of the retrieval commands, as typed dataclasses (`bertkit.options` builds their
flags from them). Kept apart from the code that embeds and ranks, like `bertkit.tasks.config`,
so that building the command line loads no model code (torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bertkit.errors import BertkitError, not_negative


@dataclass(frozen=True)
class MiningOptions:
    """Which candidates become negatives (see the module docstring)."""

    num_negatives: int = field(default=3, metadata={"help": "negatives per query (the columns negative_1..n)"})
    range_min: int = field(default=0, metadata={
        "help": "skip this many of the best candidates that pass the other rules (the likeliest unlabelled positives)"})
    range_max: int = field(default=50, metadata={"help": "candidates ranked per query to pick negatives from"})
    relative_margin: float | None = field(default=0.05, metadata={
        "help": "keep a candidate only if its cosine <= the positive's minus this fraction of it "
        "(NV-Retriever TopK-PercPos; 0.05 = 95%%)"})
    absolute_margin: float | None = field(default=None, metadata={
        "help": "keep a candidate only if its cosine <= the positive's minus this"})
    max_score: float | None = field(default=None, metadata={"help": "drop candidates whose cosine is above this"})

    def validate(self) -> None:
        # named as the flags are (finetune rerank checks its --relative-margin in the same words)
        if self.num_negatives < 1:
            raise BertkitError(f"--num-negatives must be at least 1, got {self.num_negatives}")
        if self.range_min < 0 or self.range_max < self.range_min + self.num_negatives:
            raise BertkitError(f"--range-max ({self.range_max}) must leave --num-negatives ({self.num_negatives}) "
                               f"candidates after --range-min ({self.range_min})")
        for flag, value in (("--relative-margin", self.relative_margin), ("--absolute-margin", self.absolute_margin)):
            if value is not None:
                not_negative(value, flag)


MODES = ("hybrid", "dense", "lexical")
RERANK_TOP = 50  # documents --rerank's cross-encoder re-scores by default (search, evaluate retrieval)
FUSIONS = ("rrf", "dbsf", "minmax")


@dataclass(frozen=True)
class LexicalOptions:
    """The BM25 part of an index (`bertkit.retrieval.lexical`): bm25s with Lucene's idf."""

    k1: float = field(default=1.5, metadata={"flags": ["--bm25-k1"], "help": "BM25's term-frequency saturation"})
    b: float = field(default=0.75, metadata={"flags": ["--bm25-b"], "help": "BM25's length normalisation, 0 to 1"})
    stopwords: str = field(default="en", metadata={"cli": False})
    stemmer: str | None = field(default="english", metadata={"cli": False})

    def validate(self) -> None:
        if not self.k1 >= 0:
            raise BertkitError(f"--bm25-k1 must be >= 0, got {self.k1}")
        if not 0 <= self.b <= 1:
            raise BertkitError(f"--bm25-b must be between 0 and 1, got {self.b}")


def options_of(info: dict) -> LexicalOptions:
    """The LexicalOptions an index's lexical part was built with (its index.json record)."""
    made = info.get("lexical")
    if not made:
        raise BertkitError(f"this index has no lexical part (it was built with --no-lexical): search it with "
                           "--mode dense, or add one with bertkit index add INDEX")
    return LexicalOptions(k1=made["k1"], b=made["b"], stopwords=made["stopwords"], stemmer=made["stemmer"])


# The defaults, chosen once on SciFact's train split (docs/search.md, "Choosing the fusion"): never on its
# test split, and from the flat region of the table rather than its best cell (bertkit.retrieval.tuning).
DEFAULT_FUSION, DEFAULT_ALPHA, DEFAULT_RRF_K, DEFAULT_DEPTH = "dbsf", 0.5, 60.0, 100


@dataclass(frozen=True)
class FusionOptions:
    """How a search ranks: the dense run, the lexical run, or both fused (`bertkit.retrieval.fusion`)."""

    mode: str | None = field(default=None, metadata={
        "help": "hybrid, dense or lexical (default: hybrid when the index has a lexical part, else dense)"})
    fusion: str = field(default=DEFAULT_FUSION, metadata={
        "help": "how hybrid fuses the two runs: rrf (reciprocal ranks), dbsf (scores scaled by mean +- 3 std) or "
        "minmax (scores scaled to 0..1); an index's own fusion, written by evaluate retrieval --tune, replaces "
        "these defaults"})
    alpha: float = field(default=DEFAULT_ALPHA, metadata={
        "help": "hybrid: the dense run's share of the fused score, 0 to 1 (the lexical run has 1 - alpha)"})
    rrf_k: float = field(default=DEFAULT_RRF_K, metadata={"help": "rrf: the constant k in 1 / (k + rank)"})
    depth: int = field(default=DEFAULT_DEPTH, metadata={
        "flags": ["--fusion-depth"], "help": "hybrid: documents taken from each run before fusing"})

    def validate(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise BertkitError(f"unknown mode {self.mode!r}: choose one of {', '.join(MODES)}")
        if self.fusion not in FUSIONS:
            raise BertkitError(f"unknown fusion {self.fusion!r}: choose one of {', '.join(FUSIONS)}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 <= self.alpha <= 1:
            raise BertkitError(f"alpha (the dense run's share) must be between 0 and 1, got {self.alpha!r}")
        if isinstance(self.rrf_k, bool) or not isinstance(self.rrf_k, (int, float)) or not self.rrf_k >= 0:
            raise BertkitError(f"rrf_k must be >= 0, got {self.rrf_k!r}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise BertkitError(f"the fusion depth must be at least 1, got {self.depth!r}")


# the settings that tune hybrid's fusion, by the flags that give them (`--fusion-depth`: depth's flag)
FUSION_FLAGS = {"fusion": "--fusion", "alpha": "--alpha", "rrf_k": "--rrf-k", "depth": "--fusion-depth"}
# what they need (`bertkit.errors.refuse_unneeded`), checked once the search's mode is known (an index's decides
# it): --alpha with --mode dense, or --rrf-k beside dbsf, ran and changed nothing, unsaid
FUSION_NEEDS = [
    (FUSION_FLAGS, ("mode", "hybrid"), "{flags} {set} how hybrid search fuses the dense and lexical runs, and this "
     "search is {mode} (one run, nothing fused): give --mode hybrid, or leave {it} out"),
    ({"rrf_k": "--rrf-k"}, ("fusion", "rrf"), "{flags} sets rrf's constant, and this search fuses by {fusion}: give "
     "--fusion rrf too, or leave --rrf-k out"),
]
