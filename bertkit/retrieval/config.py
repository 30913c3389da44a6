"""The settings of the retrieval commands, as typed dataclasses (`bertkit.options` builds their
flags from them). Kept apart from the code that embeds and ranks, like `bertkit.tasks.config`,
so that building the command line loads no model code (torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bertkit.errors import BertkitError


@dataclass(frozen=True)
class MiningOptions:
    """Which candidates become negatives (see the module docstring)."""

    num_negatives: int = field(default=3, metadata={"help": "negatives per query (the columns negative_1..n)"})
    range_min: int = field(default=0, metadata={
        "help": "skip this many of the best non-positive candidates (they are the likeliest unlabelled positives)"})
    range_max: int = field(default=50, metadata={"help": "candidates ranked per query to pick negatives from"})
    relative_margin: float | None = field(default=0.05, metadata={
        "help": "keep a candidate only if its cosine <= the positive's minus this fraction of it "
        "(NV-Retriever TopK-PercPos; 0.05 = 95%%)"})
    absolute_margin: float | None = field(default=None, metadata={
        "help": "keep a candidate only if its cosine <= the positive's minus this"})
    max_score: float | None = field(default=None, metadata={"help": "drop candidates whose cosine is above this"})

    def validate(self) -> None:
        if self.num_negatives < 1:
            raise BertkitError(f"num_negatives must be at least 1, got {self.num_negatives}")
        if self.range_min < 0 or self.range_max < self.range_min + self.num_negatives:
            raise BertkitError(f"range_max ({self.range_max}) must leave num_negatives ({self.num_negatives}) "
                               f"candidates after range_min ({self.range_min})")
        for name in ("relative_margin", "absolute_margin"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise BertkitError(f"{name} must be >= 0, got {value}")
