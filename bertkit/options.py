"""Typed config dataclasses <-> command-line options: every setting defined once.

A dataclass field is one option, named after it (`max_seq_length` ->
`--max-seq-length`):

- type from the annotation: int, float, str, or `X | None`; choices from a
  `Literal[...]` annotation or `metadata["choices"]`;
- help from `metadata["help"]`, with the default appended;
- booleans are flags: `--name` when the default is False, `--no-name` when True,
  both when None (not given: decided later, e.g. by the model);
- a field holding a dataclass (OptimConfig inside a training config, a
  training config inside a task's) is flattened: its fields are options too;
- metadata "flags" spells the option otherwise (the first is its name, the
  rest aliases: `["--stride", "--doc-stride"]`; a boolean's aliases spell the
  flag that turns its default around), "short" adds one ("-o"),
  "positional" makes it an argument (`list[str]`: one or more), "required"
  says so in the help (the config's `validate` checks it: on --resume the
  saved config may hold it),
  `"cli": False` keeps it off the command line, "resumable" lets `--resume`
  take another value than the run saved (its length and bookkeeping:
  --max-steps, --epochs, --save-every, --device, ...), "path" marks a file or
  folder (a run's saved relative one is read, under `--resume`, from the
  directory the run was started in), "needs" names the
  setting it tunes (`("dev", None)`: any --dev; `("loss", "cached-mnrl")`:
  that value; `("objective", ("nsp", "sop"))`: one of those;
  `("mining_index", False)`: not given; a list: each), given
  without it the flag is refused in one line, in words made from the need
  or in "says" (`needs_table`: the field's rows of the table that
  `bertkit.errors.refuse_unneeded` checks, as a hand-written command checks its own).

Every option defaults to None, meaning "not given", so `from_args` puts
exactly the given flags on top of a base: the dataclass defaults, a command's
own defaults (a dict), or under `--resume` the config the run saved; a class's
`preset_defaults(values)` puts defaults that follow another setting (a run's
--config) between the dataclass's and the base, where the run is not resumed. A flag
given with `--resume` that would change what the run computes (a learning
rate, a seed, the model, the data) is refused in one line: the resumed run
would be neither the old run nor a new one. A setting added since a run saved
its config reads, on --resume, as the value the run ran with (the class's
`ADDED_FIELDS`), not as today's default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import typing
from pathlib import Path

from bertkit.errors import BertkitError, refuse_unneeded


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def finite_float(text: str) -> float:
    """The type of every float option: a number, never nan or inf, refused where it is typed. nan passes every
    range check written `x < 0` and inf every `x > 0`: --weight-decay nan and --learning-rate inf trained,
    --epochs inf and --adam-epsilon nan ended in tracebacks, --bm25-k1 inf wrote an index.json JSON cannot read."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def count(text: str) -> int:
    """The type of every count a command defines by hand (--batch-size, -k, --top-k, --max-length, ...): an int of
    at least 1, refused where it is typed. embed, predict, evaluate, mine and search refused --batch-size 0 only
    once the model had loaded. (A settings dataclass's count is checked by its config's validate, first.)"""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


SEED_MAX = 2**32 - 1  # numpy's generators refuse a negative seed; seed * 1_000_003 + epoch stays in torch's 64 bits


def seed(text: str) -> int:
    """The type of every --seed, the same in every command: an int in 0..2**32-1 (`pretrain prepare --seed -1`
    was numpy's ValueError traceback while finetune took it)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"a seed is an int in 0..{SEED_MAX}, got {value}")
    return value


def _leaf_type(hint):
    """(converter, choices) of a field's annotation."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Literal:
        return type(hint.__args__[0]), list(hint.__args__)
    if args and typing.get_origin(hint) is not typing.Literal:  # X | None
        return _leaf_type(args[0])
    return hint, None


def fields(cls, path: tuple = ()):
    """(path, field, annotation) for every command-line setting of `cls`, nested ones flattened."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            yield from fields(hints[f.name], path + (f.name,))
        else:
            yield path + (f.name,), f, hints[f.name]


def defaults(cls) -> dict:
    """The dataclass defaults as a nested dict (required fields left out)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def merge(base: dict, more: dict) -> dict:
    """Nested settings `more` on top of `base` (a dict inside either is merged key by key)."""
    out = dict(base)
    for k, v in more.items():
        out[k] = merge(out.get(k) or {}, v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _get(d: dict, path: tuple):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def add_options(parser, cls, base: dict | None = None, skip=(), notes: dict | None = None) -> None:
    """One argparse option per setting of `cls` (see the module docstring); `base` gives shown defaults,
    `notes` {field: text} what a command adds to a field's help (a task's own metric names)."""
    shown = merge(defaults(cls), base or {})
    for path, f, hint in fields(cls):
        if f.name in skip:
            continue
        convert, choices = _leaf_type(hint)
        convert = seed if f.name == "seed" else finite_float if convert is float else convert
        choices = f.metadata.get("choices") or choices
        help_text = f.metadata.get("help", f.name.replace("_", " ")) + (notes or {}).get(f.name, "")
        if f.metadata.get("positional"):  # optional where the field defaults to None; a list takes one or more
            many = typing.get_origin(hint) is list
            nargs = {"nargs": "+"} if many else {"nargs": "?", "default": None} if f.default is None else {}
            parser.add_argument(f.name, help=help_text, metavar=f.metadata.get("metavar"), **nargs)
            continue
        default = _get(shown, path)
        flags = list(f.metadata.get("flags", [_flag(f.name)])) + ([f.metadata["short"]] if "short" in f.metadata else [])
        if convert is bool and default is None:  # three states: --name, --no-name, or not given (decided later)
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)
            continue
        if convert is bool:  # the flag that turns the default around; further "flags" are its aliases
            on = not default
            flag = flags[0] if on else "--no-" + flags[0][2:]
            parser.add_argument(flag, *flags[1:], dest=f.name, action="store_true" if on else "store_false",
                                default=None, help=help_text if on else f"turn off (on by default): {help_text}")
            continue
        if f.metadata.get("required"):
            help_text += " (required)"
        elif default is not None:
            help_text += f" (default: {default})"
        # `list[str] | None`: the flag takes one or more values
        many = any(typing.get_origin(h) is list for h in (hint, *typing.get_args(hint)))
        action = parser.add_argument(*flags, dest=f.name, type=convert, nargs="+" if many else None, default=None,
                                     choices=choices, help=help_text)
        action.setting = f  # made from a settings field: its config's validate checks the value's range


RUN_CONFIG = "run_config.json"  # a run's settings, saved in its --output directory for --resume


def from_args(args, cls, base: dict | None = None):
    """A `cls` from parsed arguments: the flags given, on top of `base` (a dict), on top of the defaults.

    Under --resume the run's saved settings (OUTPUT/run_config.json) replace
    `base`: the run goes on as it started, with the flags given on top.
    """
    given: dict = {}
    for path, f, _ in fields(cls):
        value = getattr(args, f.name, None)
        if value is not None:
            node = given
            for k in path[:-1]:
                node = node.setdefault(k, {})
            node[path[-1]] = value
    if getattr(args, "resume", None):
        saved = Path(getattr(args, "output", None) or defaults(cls).get("output") or ".") / RUN_CONFIG
        if not saved.is_file():
            raise BertkitError(f"--resume: {saved} not found; start the run without --resume first")
        try:
            base = json.loads(saved.read_text(encoding="utf-8"))
            base.items()
        except (UnicodeDecodeError, ValueError, AttributeError) as err:  # was a JSONDecodeError traceback
            raise BertkitError(f"--resume: {saved} is not a JSON object of settings ({' '.join(str(err).split())}): "
                               "the run's settings are lost; start the run again in another --output") from None
        # a setting added since the run saved its settings: the value it ran with (cls.ADDED_FIELDS)
        base = {**getattr(cls, "ADDED_FIELDS", {}), **base}
        origin = started_in(saved.parent, base.get("output"))
        refuse_changes(cls, given, merge(defaults(cls), base), saved.parent, origin)
        # a value an earlier bertkit saved as its default, which the default None means now (and which a check
        # made since may refuse as if typed): the run resumes as it ran
        base = {**base, **{k: None for k, old in getattr(cls, "EARLIER_DEFAULTS", {}).items() if base.get(k) == old}}
        base = from_start(cls, base, origin)
    start = defaults(cls)
    preset = getattr(cls, "preset_defaults", None)
    if preset is not None and not getattr(args, "resume", None):  # a resumed run has every value it ran with
        start = merge(start, preset(merge(merge(start, base or {}), given)))
    values = merge(merge(start, base or {}), given)
    refuse_unneeded(needs_table(cls), _leaves(cls, given), _leaves(cls, values))  # what was typed, on what the run has
    return build(cls, values)


MECHANISM = ("output", "resume", "overwrite")  # how a run is found and started, not what it computes


def refuse_changes(cls, given: dict, saved: dict, run_dir: Path, origin: Path | None = None) -> None:
    """Under --resume: refuse a given flag whose value differs from the run's saved one, unless its field
    is "resumable"; a path naming the same file as the saved one is the same value (a saved relative path
    read from `origin`, the directory the run was started in, when it is known)."""
    changed, fixes = [], []
    for path, f, _ in fields(cls):
        new, old = _get(given, path), _get(saved, path)
        if (new is None or f.name in MECHANISM or f.metadata.get("resumable") or new == old
                or (isinstance(new, str) and isinstance(old, str) and _same_path(new, old, origin))):
            continue
        if f.metadata.get("positional"):  # an argument: it cannot be left out, only given as the run had it
            changed.append(f"{f.name} {new} (the run used {old})")
            where = origin / old if origin is not None and isinstance(old, str) and not Path(old).is_absolute() else old
            fixes.append(f"give {f.name} as the run did ({where})")
        else:
            changed.append(f"{f.metadata.get('flags', [_flag(f.name)])[0]} {new} (the run used {old})")
    if changed:
        fix = " and ".join(fixes + ["leave the flag out"] * (len(fixes) < len(changed)))
        raise BertkitError(f"--resume: {', '.join(changed)}: a resumed run keeps the settings in "
                           f"{run_dir / RUN_CONFIG}; {fix}, or start a new run in another --output")


def started_in(run_dir: Path, saved_output) -> Path | None:
    """The directory a run was started in, which its saved relative paths are relative to: the run folder as
    found now, less the output path it saved (`runs/a` found at /w/runs/a: /w). None when that path is
    absolute, climbs (`..`) or does not end where the folder is found."""
    if not isinstance(saved_output, str) or Path(saved_output).is_absolute():
        return None
    here = run_dir.resolve()
    for part in reversed([p for p in Path(saved_output).parts if p != "."]):
        if part != here.name:
            return None
        here = here.parent
    return here


def from_start(cls, saved: dict, origin: Path | None) -> dict:
    """The saved settings with each relative "path" field read from `origin`, the directory the run was started
    in, made absolute: a run saved as `--train train.tsv --dev dev.tsv -o out` and resumed with `cd sub && ...
    -o ../out --resume` read sub/train.tsv (missing) and sub/dev.tsv (another file of that name, scored silently).
    Absolute, because the resumed run saves its settings again with `-o ../out`, from which no later resume can
    tell the start (`started_in`). A flag given now replaces its field anyway; an unknown start leaves them as typed."""
    if origin is None or origin == Path.cwd().resolve():
        return saved
    moved: dict = {}
    for path, f, _ in fields(cls):
        old = _get(saved, path)
        if f.metadata.get("path") and isinstance(old, str) and old and not Path(old).is_absolute():
            node = moved
            for k in path[:-1]:
                node = node.setdefault(k, {})
            node[path[-1]] = os.path.normpath(origin / old)
    return merge(saved, moved)


def _same_path(new: str, old: str, origin: Path | None) -> bool:
    """Whether two spellings of a path name one file: as given now, and as saved, read from where it was
    saved (`cd runs && ... ../data` names the run's `data/`)."""
    if Path(new).resolve() == Path(old).resolve():
        return True
    return origin is not None and not Path(old).is_absolute() and Path(new).resolve() == (origin / old).resolve()


def needs_table(cls) -> list:
    """The rows of `cls`'s fields whose metadata "needs" another setting, one a need (a list: each), in the order
    of the fields: the table `bertkit.errors.refuse_unneeded` checks (`finetune classify --max-dev-examples 5`
    without --dev, `finetune qa --null-score-diff-threshold 2` without --version-2-with-negative, `finetune embed
    --mini-batch-size 8` with an mnrl loss: each ran without it). The field's "says" gives the words, else they
    are made from the need. A setting is named by its field alone: flattened, a config's names are its flags'."""
    settings = {f.name: f for _, f, _ in fields(cls)}
    flag = {name: f.metadata.get("flags", [_flag(name)])[0] for name, f in settings.items()}
    rows = []
    for f in settings.values():
        needs = f.metadata.get("needs", [])
        for name, wanted in needs if isinstance(needs, list) else [needs]:
            says = f.metadata.get("says") or _needs_words(flag[name], name, wanted, settings[name].default)
            rows.append(({f.name: flag[f.name]}, (name, wanted), says))
    return rows


def _needs_words(flag: str, name: str, wanted, default) -> str:
    """The refusal of a setting given without `flag` as it `wanted` (see `needs_table`)."""
    said = "/".join(wanted) if isinstance(wanted, tuple) else wanted  # a tuple: any of those values
    need = flag + ("" if wanted in (None, True, False) else f" {said}")
    if wanted is False:
        return f"{{flags}} is not used beside {need} (a run with {need} never reads it): leave one of them out"
    if wanted is None and default is not None:  # set by default: given as 0 (--eval-every 0 --eval-sequences 10)
        return (f"{{flags}} is used only when {need} is not {{{name}}}: leave {{flags}} out, or give {need} a value "
                "that turns it on")
    return f"{{flags}} is used only with {need}: give {need} too, or leave {{flags}} out"


def _leaves(cls, settings: dict) -> dict:
    """The nested `settings` of `cls` by field name (flattened, as the command line names them)."""
    return {f.name: _get(settings, path) for path, f, _ in fields(cls)}


def build(cls, values: dict):
    """`cls(**values)` with nested dataclasses built too; a missing required setting names its flag."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = build(hints[f.name], values.get(f.name) or {})
        elif f.name in values:
            kwargs[f.name] = values[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise BertkitError(f"{f.metadata.get('flags', [_flag(f.name)])[0]} is required")
    return cls(**kwargs)


def given(args, names) -> dict:
    """The options among `names` given on the command line (not None), by name: what a command hands on, leaving
    the rest to the library's defaults."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


# --- option groups several commands share ---------------------------------------------

DTYPE_CHOICES = ("auto", "float32", "bfloat16")  # --dtype: auto is bf16 where native (bertkit.runtime.devices.auto_dtype)


# the rows (`bertkit.errors.refuse_unneeded`) that search, evaluate retrieval and serve share
RERANK_TOP_SAYS = "{flags} sets how many documents --rerank's cross-encoder re-scores: give --rerank MODEL too"
SEARCH_NEEDS = [
    ({"rerank_top": "--rerank-top"}, ("rerank", None), RERANK_TOP_SAYS),  # without a reranker it reranked nothing
    ({"ann": "--ann"}, ("lexical", False), "{flags} sets how the dense run finds its passages, and --mode lexical "
     "ranks by BM25 alone: leave it out, or search with --mode dense or hybrid"),  # with it, no graph was walked
]


def device_flags(p, dtype: str = "auto") -> None:
    """--device and --dtype, the same for every command that runs a model for inference. The commands that show
    a model's own figures (attention, fill-mask) default to float32: what transformers and bertviz compute, which a
    learner holds them against; auto's bfloat16 moved the weights by about 0.01 on a CPU with native bf16."""
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where the model runs: auto (the GPU if torch sees one, else the CPU), cpu or cuda")
    auto = ("auto (bfloat16 where the device multiplies it natively, a CPU with amx_bf16/avx512_bf16 or an Ampere or "
            "later GPU; float32 elsewhere)")
    choices = (f"{auto}, float32 (exact)" if dtype == "auto" else f"float32 (exact, the model's own figures), {auto}")
    p.add_argument("--dtype", default=dtype, choices=list(DTYPE_CHOICES),
                   help=f"the precision (default {dtype}): {choices}, or bfloat16 (on a CPU without native bf16 it is "
                   "emulated, slower, and a warning says so)")


def quiet_flag(p) -> None:
    """--quiet, and its other spelling --no-progress (the training commands' flag, `progress` in TrainConfig)."""
    p.add_argument("--quiet", "--no-progress", action="store_true", help="no progress bar")


def int8_flag(p) -> None:
    """--int8 for the commands that run a model for inference on the CPU."""
    p.add_argument("--int8", action="store_true",
                   help="int8 dense layers (dynamic quantization, bertkit.quantize): a quarter of the weights' "
                   "memory and, on CPUs without bf16, often faster than float32, for a small accuracy cost; "
                   "where the CPU has bf16, --dtype auto is usually faster (docs/deployment.md: which dtype on "
                   "which CPU); CPU only")
