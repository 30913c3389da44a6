"""The one error type for user mistakes, and the range checks every layer asks in the same words.

Anything a user can get wrong at the edges (a wrong type, an unknown token id, a
sequence too long, a corrupt or mismatched checkpoint, a bad CLI argument) raises
`BertkitError` with a message that names the problem and, where there is one, the
fix. The CLI prints that message as a single line instead of a traceback. Asserts
are kept for our own invariants only.

The checks of a count ("an int of at least N": a bool is no count), of a positive
number, of one that is not negative, of a probability in [0, 1] and the reading of a score from a data file
are written here once; each caller names the
setting as its user spells it (`--top-k`, `BertConfig.hidden_size`) and may say the
bound in its own words (`says`) or add a hint. A NaN passes none of them.
"""


class BertkitError(ValueError):
    """A user-facing error: the message says what was wrong and how to fix it."""


def int_at_least(value, least: int, name: str, says: str = "an int of at least {least}"):
    """`value` when it is an int (not a bool) of at least `least`; else "NAME must be SAYS, got VALUE"."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BertkitError(f"{name} must be {says.format(least=least)}, got {value!r}")
    return value


def positive(value, name: str, hint: str = ""):
    """`value` when it is above 0; else "NAME must be > 0, got VALUE" and the `hint` (" (BERT uses 2-4)")."""
    if not value > 0:
        raise BertkitError(f"{name} must be > 0, got {value}{hint}")
    return value


def not_negative(value, name: str):
    """`value` when it is 0 or more; else "NAME must be >= 0, got VALUE" (a NaN too: it passes `value < 0`)."""
    if not value >= 0:
        raise BertkitError(f"{name} must be >= 0, got {value}")
    return value


def probability(value, name: str):
    """`value` when it lies in [0, 1]; else "NAME must be in [0, 1], got VALUE"."""
    if not 0 <= value <= 1:
        raise BertkitError(f"{name} must be in [0, 1], got {value}")
    return value


def read_score(raw, where: str, hint: str = "") -> float:
    """The finite number a data file's score cell `raw` holds; else "WHERE: score RAW is not a (finite)
    number" and the `hint`. nan and inf parse as floats: a regression's first loss or a correlation was nan."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise BertkitError(f"{where}: score {raw!r} is not a number{hint}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise BertkitError(f"{where}: score {raw!r} is not a finite number{hint}")
    return value
