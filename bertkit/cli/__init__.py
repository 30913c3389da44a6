"""The bertkit command line: thin, typed commands over the library.

Each command parses its arguments, calls one library function and prints the
result. Imports happen inside the handlers so that `bertkit --help` and the
tokenizer commands start without loading torch. A user mistake (BertkitError,
a missing file) or a file the machine refuses (a full disk, a file-size limit, no
permission: `machine_said()`) prints one line on stderr and exits with status 2, never a
traceback; user files are opened through `bertkit.data.textfiles`, so a directory or
a file that is not UTF-8 text gets that one line too. A developer who needs to see where
an error came from runs `bertkit --traceback COMMAND ...`: Python's traceback above the line.

One module per area (`text`: tokenizer and vocabularies, `model`: model info and
export, `pretrain`: pre-training, fill-mask and electra show, `finetune`: fine-tuning,
prediction and the demo command (its data and run: `demo`), `features`: embeddings and
attention pictures, `evaluate`: evaluate and mine, `search`: index and search, `distill`,
`serve`: the HTTP server); add a command next to its siblings and register its `add_*`
function in COMMANDS below. Settings that have a config dataclass become options
through `bertkit.options`, so each is defined once.
"""

import argparse
import difflib
import errno
import os
import re
import sys
import traceback
import warnings
from pathlib import Path

from bertkit.cli.distill import add_distill
from bertkit.cli.evaluate import add_evaluate, add_mine
from bertkit.cli.features import add_attention, add_embed
from bertkit.cli.finetune import add_demo, add_finetune, add_predict
from bertkit.cli.model import add_export, add_model
from bertkit.cli.pretrain import add_electra, add_fill_mask, add_pretrain
from bertkit.cli.search import add_index, add_search
from bertkit.cli.serve import add_serve
from bertkit.cli.text import add_tokenize, add_vocab
from bertkit.errors import BertkitError
from bertkit.runtime.allocator import reuse_freed_memory

EPILOG = """examples:
  bertkit tokenize "Hello, how are you?" --pair "I am fine."
  bertkit vocab train corpus/ -o vocab.txt --vocab-size 8000
  bertkit vocab check vocab.txt
  bertkit model info --class BertForSequenceClassification
"""


class Parser(argparse.ArgumentParser):
    """argparse, its mistakes said as every other user mistake is: one line `bertkit: error: ...`, exit 2.

    argparse printed its usage block (a dozen lines for finetune) above `bertkit finetune classify: error: ...`;
    the line names the command's --help instead. A value that is not one of the choices (a mistyped command,
    `--pooling mena`) is answered with the closest one, as Python 3.14's suggest_on_error does. Subparsers
    are made of the same class (argparse's parser_class default), so every command answers so."""

    def error(self, message):
        self.exit(2, f"bertkit: error: {closest_choice(message)} ({self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        parsed, extra = super().parse_known_args(args, namespace)
        parsed.__dict__.setdefault("help_of", self.prog)  # the innermost command's, set first: whose options
        return parsed, extra

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if TRACEBACK in extra:  # the top parser's flag, not the command's
            self.exit(2, f"bertkit: error: {TRACEBACK} goes before the command: bertkit {TRACEBACK} "
                         f"{parsed.help_of.removeprefix('bertkit ')} ...\n")
        if extra:  # argparse said it from the top parser: `bertkit --help` lists no option of finetune classify
            self.exit(2, f"bertkit: error: unrecognized arguments: {' '.join(extra)} ({parsed.help_of} --help)\n")
        return parsed


# argparse's words for a value outside `choices` ('x' quoted before Python 3.12.8, bare after)
INVALID_CHOICE = re.compile(r"invalid choice: '?(?P<given>.*?)'? \(choose from (?P<choices>.*)\)$")


def closest_choice(message: str) -> str:
    """`message`, and when it refuses a choice close to a valid one, that one in place of the whole list."""
    found = INVALID_CHOICE.search(message)
    if not found or "did you mean" in message:
        return message
    choices = [c.strip().strip("'") for c in found["choices"].split(",")]
    close = difflib.get_close_matches(found["given"], choices, n=1)
    if not close:
        return message
    return message[: found.start()] + f"invalid choice: {found['given']!r}: did you mean {close[0]!r}?"


# A person gets one line for every error (what was wrong, what to do); a developer asks for where it came from
# with the top parser's flag, read here at the command line's edge, never inside the library
TRACEBACK = "--traceback"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="bertkit",
        description="BERT from scratch: tokenize, pre-train, fine-tune, embed and look inside.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(TRACEBACK, action="store_true",
                        help="on an error, print Python's traceback above the one line (for a developer; the exit "
                        "status stays the same)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


COMMANDS = [add_tokenize, add_vocab, add_model, add_embed, add_attention, add_finetune, add_predict, add_export, add_demo, add_pretrain,
            add_fill_mask, add_electra, add_serve, add_evaluate, add_mine, add_index, add_search,
            add_distill]


# What the `bertkit` command decides for its own process, before torch loads (its OpenMP runtime
# reads the environment once, when it starts). A value the user set is kept.
#   OMP_WAIT_POLICY=PASSIVE: a thread that finishes its share of a parallel region sleeps instead of
#   spinning for the next one. Spinning costs nothing on an idle machine and everything beside another
#   busy process: the spinning threads take the cores the working ones need, and pre-training, many
#   short regions per step, waits at a barrier after each one (docs/benchmarks.md, "Beside another job",
#   bench/bench_contention.py, has the slowdown).
PROCESS = {"OMP_WAIT_POLICY": "PASSIVE"}
# A progress bar redrawn into a log file is a new line every 0.1 s: when stderr is not a terminal,
# tqdm (>= 4.66 reads TQDM_* defaults) redraws at most every 30 s.
NOT_A_TERMINAL = {"TQDM_MININTERVAL": "30"}


def process_settings(environ=None, terminal: bool | None = None) -> dict:
    """Set PROCESS (and NOT_A_TERMINAL, when stderr is not a terminal) in `environ` (default
    os.environ) where the user has not; returns what it set. Call it before torch is imported."""
    environ = os.environ if environ is None else environ
    terminal = sys.stderr.isatty() if terminal is None else terminal
    wanted = {**PROCESS, **({} if terminal else NOT_A_TERMINAL)}
    made = {key: value for key, value in wanted.items() if key not in environ}
    environ.update(made)
    return made


# What the environment may say about the fast path (`bertkit.runtime.fast.decide`), read here and
# nowhere in the library: BERTKIT_ONEDNN=1 sends every float32 matmul to oneDNN, 0 every one to MKL
# (torch's F.linear); unset, the CPU's own rules decide.
ONEDNN = {"1": True, "0": False}


def speed_settings(onednn: bool | None):
    """The fast-path settings of a command that runs a model (`bertkit.runtime.fast.SpeedSettings`):
    decided once, here, from this CPU and what the environment forces; handed down to `accelerate`."""
    from bertkit.runtime.fast import decide  # late: torch loads only for a command that runs a model

    return decide(onednn=onednn)


def check_ranks(args, environ=None) -> None:
    """Refuse, on every rank, a command that runs in one process but was started by torchrun with several.

    Each rank ran the whole command, all writing the same files: `pretrain prepare` stopped on one rank
    reading the other's half-written folder, `distill static` with a traceback. The commands written for
    several processes say so in their parser: `set_defaults(torchrun=True)`, or a function of the arguments
    (`index` builds under torchrun; `index add`, `index export` do not)."""
    environ = os.environ if environ is None else environ
    allowed = getattr(args, "torchrun", False)
    if int(environ.get("WORLD_SIZE", "1")) > 1 and not (allowed(args) if callable(allowed) else allowed):
        raise BertkitError("this command runs in one process: run it without torchrun (torchrun runs pretrain run, "
                           "finetune, index and distill layers)")


# What a command writes, as its parser names it (`set_defaults(outputs={flag: kind})`):
#   file       a file it writes (new, or replaced), in a folder that exists
#   file+dirs  the same, the missing folders made by the command itself (embed)
#   cache      a file it reads back when it holds what the run needs, else writes, folders made (a teacher cache)
#   folder     a folder it writes into; either: a file or a folder (vocab train)
FILE_KINDS = ("file", "file+dirs", "cache")


def check_outputs(args) -> None:
    """Refuse, before anything loads, an output its command cannot write or would write over its own input.

    A file output may not be a folder nor lie in a folder that does not exist (both failed only once the
    work was done), a folder output may not be a file (FileExistsError's traceback), an output's place must be
    one the command may write (`_check_writable`: not read-only, not under a file), and an existing file
    is not written over when it is one of the files the command reads or lies in a folder it reads
    (`embed x.jsonl -o x.jsonl` emptied its input; `mine beir/ -o beir/qrels/test.tsv` replaced the qrels).
    What the command reads: every other argument that names an existing path."""
    outputs = {flag.lstrip("-").replace("-", "_"): (flag, kind) for flag, kind in getattr(args, "outputs", {}).items()}
    if not outputs:
        return
    values = [v for name, value in vars(args).items() if name not in outputs
              for v in (value if isinstance(value, list) else [value]) if isinstance(v, str) and v]
    # os.path.exists, not Path.exists: a text argument longer than a file name may be (fill-mask's, a query)
    # is not a path, and Path.exists raises OSError (ENAMETOOLONG) for it
    reads = [Path(v).resolve() for v in values if os.path.exists(v)]
    _check_distinct(args, outputs)
    for name, (flag, kind) in outputs.items():
        value = getattr(args, name, None)
        if value is None or value == "-":
            continue
        out = Path(value)
        _check_writable(flag, out, kind)
        _check_shape(flag, out, kind)
        if kind == "cache" or not os.path.isfile(out):
            continue
        for source in reads:
            if source == out.resolve():
                raise BertkitError(f"{flag} {out} is a file this command reads: writing it would destroy the "
                                   f"input; write to another file")
            if source.is_dir() and source in out.resolve().parents:
                raise BertkitError(f"{flag} {out} is a file in {source}, a folder this command reads: write "
                                   "to a file outside it, or a new one")


def _check_distinct(args, outputs: dict) -> None:
    """Refuse two output flags naming one file: the second write replaced the first's (`mine -o m.tsv
    --report m.tsv` wrote the rows, then the report over them, and said the rows were there)."""
    seen = {}
    for name, (flag, _) in outputs.items():
        value = getattr(args, name, None)
        if value is None or value == "-":
            continue
        other = seen.setdefault(Path(value).resolve(), flag)
        if other != flag:
            raise BertkitError(f"{other} and {flag} name the same file {value}: the second would replace the "
                               "first; give each its own file")


def _check_shape(flag: str, out: Path, kind: str) -> None:
    if kind == "folder" and os.path.exists(out) and not os.path.isdir(out):
        raise BertkitError(f"{flag} {out} is a file, not a folder: name a folder to write into")
    if kind in FILE_KINDS and os.path.isdir(out):
        raise BertkitError(f"{flag} {out} is a folder: name the file to write (a path inside it, or another)")
    if kind == "file" and not os.path.isdir(out.parent):
        raise BertkitError(f"{flag} {out}: the folder {out.parent} does not exist; make it first "
                           f"(mkdir -p {out.parent}) or write elsewhere")


def _check_writable(flag: str, out: Path, kind: str) -> None:
    """Refuse an output in a place the command may not write: a folder on a read-only file system or without
    write permission, or a path that runs through a file (`-o notes.txt/v.npy`). Each was found only where the
    first file was written: after every vector was embedded, every row predicted, the vocabulary trained."""
    if kind == "cache" and os.path.exists(out):  # read back, not written, when it holds what the run needs
        return
    place = out.parent if kind in FILE_KINDS or os.path.isfile(out) else out
    while not os.path.exists(place) and place != place.parent:  # the folder the command will make its way from
        place = place.parent
    if not os.path.isdir(place):
        raise BertkitError(f"{flag} {out}: {place} is a file, not a folder: name a path in a folder")
    if not os.access(place, os.W_OK | os.X_OK):
        why = "a read-only file system" if os.statvfs(place).f_flag & os.ST_RDONLY else "no write permission"
        raise BertkitError(f"{flag} {out}: the folder {place} cannot be written ({why}): write elsewhere")


def _warning_line(message, category, filename, lineno, line=None) -> str:
    return f"bertkit: warning: {message}\n"  # advice for a person, not a source location


# a layer list counted from the top (`--layers -1,-2`): argparse takes a word starting with a minus for an
# option unless it is one number, so the list is glued to its flag (`--layers=-1,-2`) before parsing
NEGATIVE_LIST = re.compile(r"-\d+(,\s*-?\d+)+")


def glue_negative_lists(argv: list) -> list:
    """`argv` with each `--layers` followed by a negative list written `--layers=LIST`."""
    out = []
    for word in argv:
        if out and out[-1] == "--layers" and NEGATIVE_LIST.fullmatch(word):
            out[-1] = f"--layers={word}"
        else:
            out.append(word)
    return out


def main(argv=None) -> int:
    if argv is None:  # the `bertkit` command owns its process: settings torch reads when it loads
        process_settings()
    parser = build_parser()
    args = parser.parse_args(glue_negative_lists(sys.argv[1:] if argv is None else list(argv)))
    if argv is None:  # ... and big activations reuse freed memory
        reuse_freed_memory()
        warnings.formatwarning = _warning_line
        if sys.stdout is not None:  # None when started with it closed (>&-): print() then writes nothing
            sys.stdout = NamedStream(sys.stdout, "standard output")
    # the environment's choice for the fast path, read once for every command (a server decides its
    # settings itself from it, after setting its threads); a command that runs a model gets them made
    args.onednn = ONEDNN.get(os.environ.get("BERTKIT_ONEDNN", ""))
    try:
        check_ranks(args)
        check_outputs(args)
        if getattr(args, "runs_model", False):
            args.speed = speed_settings(args.onednn)
        args.handler(args)
    except BertkitError as err:
        said(args, f"bertkit: error: {err}")
        return 2
    except BrokenPipeError:
        return 0
    except OSError as err:  # the machine said no: a full disk, a file-size limit, a folder it may not write...
        said(args, f"bertkit: error: {machine_said(err, resumable=resumable(args))}")
        return 2
    except KeyboardInterrupt:  # Ctrl-C: a person's choice, not a crash (no traceback); 130 as a shell reports it
        again = "; --resume goes on from the last checkpoint" if resumable(args) else ""
        said(args, f"bertkit: interrupted{again}")
        return 130
    return 0


def said(args, line: str) -> None:
    """The one line of an error on stderr; under --traceback the exception's traceback above it."""
    if args.traceback:
        traceback.print_exc(file=sys.stderr)
    print(line, file=sys.stderr)


def resumable(args) -> bool:
    """Whether the same command with --resume goes on where this one stopped: its parser's `resumes` (a function
    of the arguments: `index add` has the flag and refuses it), else whether it has --resume at all."""
    says = getattr(args, "resumes", None)
    return says(args) if callable(says) else hasattr(args, "resume")


# What a person can do when the machine refuses a file (the errno's words come first, then this)
ADVICE = {
    errno.ENOSPC: "the disk is full: free some space or write elsewhere, then run the command again",
    errno.EDQUOT: "your disk quota is used up: free some space or write elsewhere, then run the command again",
    errno.EFBIG: "over this process's file-size limit, ulimit -f, or the file system's: raise the limit or write "
                 "elsewhere",
    errno.EROFS: "write to a folder on a writable file system",
    errno.EACCES: "check its permissions and its folder's (ls -ld), or use another path",
    errno.EPERM: "check its permissions and its folder's (ls -ld), or use another path",
}
# where the same command with --resume picks the work up again
CUT_SHORT = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def machine_said(err: OSError, resumable: bool = False) -> str:
    """An OSError in one line for a person: the file, the system's words, what to do. Printed as Python
    says it, it was errno soup ("[Errno 28] No space left on device", no file named, or the lock file
    beside the one asked for); `bertkit.data.atomic` names the file the command writes."""
    if err.errno is None or not err.strerror:  # a message of our own (BlockingIOError's) or a library's
        return str(err)
    where = "".join(f"{name}: " for name in (err.filename, err.filename2) if name is not None)
    advice = ADVICE.get(err.errno)
    again = "; --resume goes on from the last checkpoint" if resumable and err.errno in CUT_SHORT else ""
    return f"{where}{err.strerror}{f' ({advice}{again})' if advice else ''}"


class NamedStream:
    """The command's standard output, whose refused writes name it: `predict --output - > /dev/full` (or a full
    disk behind `>`) raised "No space left on device" naming no file. Set by `main` for the process it owns."""

    def __init__(self, stream, name: str):
        self._stream, self._name = stream, name

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as err:
            raise self._said(err) from None

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        try:
            self._stream.flush()
        except OSError as err:
            raise self._said(err) from None

    def _said(self, err: OSError) -> OSError:
        return OSError(err.errno, err.strerror, self._name) if err.errno and err.filename is None else err

    def __getattr__(self, attr):
        return getattr(self._stream, attr)
