"""The command line as a whole, flag by flag: every parser walked, a property checked for every option of a kind.

The walks below cover the options a command gains later too: a new float flag must refuse nan and inf, a new
--seed takes the seeds every other command takes, and an argparse mistake is one `bertkit: error:` line like
every other user mistake.
"""

import argparse

import pytest

from bertkit.cli import build_parser, main


def leaves(parser, path=()):
    """(command words, parser) for every command that takes options (`finetune classify`, `embed`, ...)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
        return
    for name, sub in subs[0].choices.items():
        yield from leaves(sub, path + (name,))


def refused(argv, capsys) -> str:
    """The one error line `bertkit argv` prints, asserting exit code 2 and nothing else on stderr."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertkit: error: "), err
    return lines[0]


@pytest.mark.parametrize("argv, meant", [
    (["fintune"], "finetune"),
    (["finetune", "clasify"], "classify"),
    (["vocab", "trian"], "train"),
    (["evaluate", "retreival", "x"], "retrieval"),
    (["embed", "x.txt", "-o", "y.npy", "--pooling", "mena"], "mean"),
])
def test_a_mistyped_command_or_choice_is_one_line_naming_the_one_meant(argv, meant, capsys):
    """Python before 3.14 lists every choice and no suggestion, under a usage block of many lines."""
    line = refused(argv, capsys)
    assert f"did you mean '{meant}'?" in line
    assert "invalid choice" in line  # argparse's own words kept: what was wrong


@pytest.mark.parametrize("argv, says", [
    (["embed"], "the following arguments are required: input, -o/--output"),
    (["search", "ix", "q", "-k", "ten"], "argument -k: invalid int value: 'ten'"),
    (["finetune", "classify", "--train", "t.tsv", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["index", "c", "--vectors", "int4"], "argument --vectors: invalid choice: 'int4'"),
])
def test_every_parse_error_is_one_line_naming_the_command_help(argv, says, capsys):
    line = refused(argv, capsys)
    assert says in line
    # the usage block argparse prints is replaced by where to read it
    assert line.endswith(f"(bertkit {' '.join(w for w in argv[:2] if not w.startswith('-') and w in COMMAND_WORDS)} "
                         "--help)")


COMMAND_WORDS = {word for path, _ in leaves(build_parser()) for word in path.split()}


def test_help_still_prints_the_usage(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["finetune", "classify", "--help"])
    assert stop.value.code == 0 and "usage: bertkit finetune classify" in capsys.readouterr().out
