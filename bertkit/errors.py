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

So is the refusal of a setting given without the one it tunes (`refuse_unneeded`): every command,
config and library step that refuses one declares a table of what each setting needs, and this one
function checks it, wherever the setting it needs becomes known (the command line, a config's own
values, an index's mode, a teacher's kind).

And so is the way a figure with no value is said (`figure`): a correlation of constant scores is None (null
in metrics.json) or scipy's nan, and every report (finetune's epochs and summary, predict's scores, evaluate
sts) prints it as "undefined", any other figure with 4 decimals. And the error for a text that yields no tokens
(`no_tokens`), which every embedding path (a static table, a transformer's windows) says in the same words.

And so is the warning that a model read texts cut at its max length (`say_cut`): embed, search, evaluate retrieval,
mining and reranking each count the texts cut where they are read, and say it in this one line. And a switch
(`switch`, a settings dataclass's `bool_settings`): True or False, never a str, which is true whatever it says.
"""

import dataclasses
import warnings


class BertkitError(ValueError):
    """A user-facing error: the message says what was wrong and how to fix it."""


class MissingPackage(BertkitError, ImportError):
    """A package an optional extra installs (or the default model's) is missing: the message names it and the pip
    command. A BertkitError (the command says it in one line) that is also an ImportError, so a program written the
    usual way round an optional package (`except ImportError`) meets it as one."""


class NoSpace(BertkitError, OSError):
    """A long run refused before it writes: its disk certainly cannot hold what it would write
    (`bertkit.data.atomic.room_for`), said in one line naming the folder and the bytes needed. A BertkitError (the
    command's one line; under torchrun passed to every rank) that is also an OSError, like the ENOSPC it forestalls:
    a program catching either meets it (embed and pretrain prepare raised an OSError, build_index a BertkitError)."""


def int_at_least(value, least: int, name: str, says: str = "an int of at least {least}"):
    """`value` when it is an int (not a bool) of at least `least`; else "NAME must be SAYS, got VALUE"."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BertkitError(f"{name} must be {says.format(least=least)}, got {value!r}")
    return value


def switch(value, name: str, none: bool = False):
    """`value` as a bool when it is True or False (numpy's bool, or 0 and 1, too; None where `none`: the
    default's "decide for me"); else "NAME must be True or False, got VALUE". A str was taken for true
    whatever it said: normalize="false", read from a settings file, normalised every vector."""
    if (value is None and none) or isinstance(value, bool):
        return value
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")  # 2.x, 1.x
    if numpy_bool or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise BertkitError(f"{name} must be True or False{' (or None)' if none else ''}, got {value!r}")


def bool_settings(settings) -> None:
    """Each setting of a settings dataclass annotated `bool` (or `bool | None`) made a bool (`switch`), called by
    the configs' __post_init__: the Python API's training={"overwrite": "false"} replaced the folder, a non-empty
    str being true. (The command line's flags give bools.)"""
    for f in dataclasses.fields(settings):
        kind = str(f.type).replace(" ", "")  # text under `from __future__ import annotations`
        if kind in ("bool", "bool|None", str(bool)):
            value = switch(getattr(settings, f.name), f.name, none=kind == "bool|None")
            object.__setattr__(settings, f.name, value)  # a frozen one's too (StaticDistillConfig)


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


def refuse_unneeded(table, given: dict, have: dict) -> None:
    """Refuse in one line a setting given without the one it tunes: the run would take it and go on without it,
    unsaid (`search --ef-search 64` without --ann scanned every vector). `table` holds rows

        (flags, (name, wanted), says)

    - flags, {setting: "--flag"}: the settings of the row; those `given` (with a value, not None or False) are
      refused together, in one line;
    - (name, wanted): what they need of `have[name]`: wanted None, that it is set (true); False, that it is
      not; a tuple, one of those values; any other value, that one;
    - says, the refusal: {flags} names the given ones ("--a and --b"), {set} is "sets" or "set", {it} "it" or
      "them", {given} each with its value ("--seed 3"), and {name} any value of `have`.

    The first row that has a setting given and its need unmet refuses. `given` is what the user typed (a
    command line's options, which default to None) or, for a library caller's settings, those that differ from
    their defaults; `have`, the settings and facts the needs read."""
    for flags, (name, wanted), says in table:
        # by identity: a setting given as 0 is given (0 == False)
        typed = [(flag, given[dest]) for dest, flag in flags.items() if given.get(dest) is not None
                 and given[dest] is not False]
        value = have.get(name)
        if not typed or (bool(value) if wanted is None else not value if wanted is False
                         else value in wanted if isinstance(wanted, tuple) else value == wanted):
            continue
        one = len(typed) == 1
        raise BertkitError(says.format_map({**have, "flags": " and ".join(flag for flag, _ in typed),
                                            "set": "sets" if one else "set", "it": "it" if one else "them",
                                            "given": " and ".join(f"{flag} {v}" for flag, v in typed)}))


def undefined(value) -> bool:
    """A figure with no value: None (null in metrics.json) or nan."""
    return value is None or value != value


def figure(value) -> str:
    """A figure as every report says it: 4 decimals, or "undefined" (`undefined`)."""
    return "undefined" if undefined(value) else f"{value:.4f}"


def no_tokens(text: str, where: str | None = None) -> BertkitError:
    """The error for a text that yields no tokens, named by `where` (e.g. "file.txt:7") when known: said in these
    words by every embedding path (a static table's mean, a transformer's windows)."""
    return BertkitError(f"{where + ': ' if where else ''}text {text[:40]!r} yields no tokens: it holds only "
                        "characters BERT drops")


def say_cut(counted, length: int, how: str, head: str = "", stacklevel: int = 2) -> None:
    """Warn, in one line, that texts longer than the `length` tokens a model reads were read cut there: a chapter's
    vector was its first page's, a 700-token abstract ranked by its first 256 tokens, a (query, passage) pair scored
    on its first 128, without a word. counted: (what, how many cut, of how many), each the count of the pass that
    read them (an `on_cut`); `how`: as whom, or what to do; `head`: what reads them, when the line needs it (a
    reranker's folder). Nothing when none was cut. stacklevel: as `warnings.warn`'s, from the caller's frame."""
    if said := " and ".join(f"{cut} of {n} {what}" for what, cut, n in counted if cut):
        warnings.warn(f"{head}{said} are longer than the {length} tokens the model reads (its max length), and it "
                      f"read them cut there, {how}", stacklevel=stacklevel + 1)
