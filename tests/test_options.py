"""The option builder: typed dataclasses -> argparse options -> the same dataclasses back."""

import argparse
import json
from pathlib import Path
from dataclasses import dataclass, field
from typing import Literal

import pytest

from bertkit.errors import BertkitError
from bertkit.options import add_options, from_args


@dataclass
class Inner:
    rate: float = field(default=0.5, metadata={"help": "a rate"})
    mode: str = field(default="a", metadata={"help": "a mode", "choices": ("a", "b")})


@dataclass
class Outer:
    source: str = field(default=None, metadata={"help": "where from", "required": True})
    count: int = field(default=3, metadata={"help": "how many", "resumable": True})
    limit: int | None = field(default=None, metadata={"help": "at most"})
    kind: Literal["x", "y"] = field(default="x", metadata={"help": "which kind"})
    loud: bool = field(default=False, metadata={"help": "say more"})
    bars: bool = field(default=True, metadata={"help": "show bars"})
    overlap: int = field(default=8, metadata={"help": "tokens shared", "flags": ["--stride", "--doc-stride"]})
    hidden: str = field(default="h", metadata={"cli": False})
    output: str = field(default="out", metadata={"help": "where to"})
    resume: bool = field(default=False, metadata={"help": "go on"})
    inner: Inner = field(default_factory=Inner)


def parse(*argv, base=None):
    p = argparse.ArgumentParser()
    add_options(p, Outer, base)
    return from_args(p.parse_args([str(a) for a in argv]), Outer, base), p


def test_each_field_is_one_typed_option_and_comes_back():
    cfg, p = parse("--source", "s", "--count", 5, "--kind", "y", "--loud", "--no-bars", "--doc-stride", 4,
                   "--rate", 0.25, "--mode", "b")
    assert cfg == Outer(source="s", count=5, kind="y", loud=True, bars=False, overlap=4, inner=Inner(0.25, "b"))
    assert parse("--source", "s", "--stride", 6)[0].overlap == 6  # the first spelling and its alias
    defaults, _ = parse("--source", "s")
    assert defaults == Outer(source="s") and defaults.inner == Inner()
    text = p.format_help()
    assert "how many (default: 3)" in text and "where from (required)" in text and "--hidden" not in text
    with pytest.raises(SystemExit):  # choices come from Literal and from metadata
        parse("--source", "s", "--kind", "z")
    with pytest.raises(SystemExit):
        parse("--source", "s", "--mode", "c")


def test_a_base_gives_defaults_and_given_flags_go_on_top(tmp_path):
    base = {"count": 7, "inner": {"mode": "b"}}
    cfg, p = parse("--rate", 0.1, base=base)
    assert (cfg.count, cfg.inner.mode, cfg.inner.rate, cfg.source) == (7, "b", 0.1, None)
    assert "how many (default: 7)" in p.format_help()
    (tmp_path / "run_config.json").write_text(json.dumps({"source": "old", "count": 9, "loud": True,
                                                          "inner": {"rate": 0.9, "mode": "b"}}))
    cfg, _ = parse("--output", tmp_path, "--resume", "--count", 2, base=base)  # the saved run, the flags on top
    assert (cfg.source, cfg.count, cfg.loud, cfg.inner.rate, cfg.inner.mode) == ("old", 2, True, 0.9, "b")
    assert cfg.resume and cfg.output == str(tmp_path)
    with pytest.raises(BertkitError, match="start the run without --resume"):
        parse("--output", tmp_path / "none", "--resume")


def test_resume_refuses_a_flag_that_changes_what_the_run_computes(tmp_path, monkeypatch):
    """A resumed run is the saved run: another rate, mode or source would mix two runs; a "resumable" field
    (the run's length) may change, and a flag repeating the saved value, or naming the same file, is fine."""
    (tmp_path / "data.txt").write_text("x")
    (tmp_path / "run_config.json").write_text(json.dumps({"source": str(tmp_path / "data.txt"), "count": 9,
                                                          "inner": {"rate": 0.9, "mode": "b"}}))
    with pytest.raises(BertkitError) as refused:
        parse("--output", tmp_path, "--resume", "--rate", 0.3, "--mode", "a")
    assert str(refused.value).startswith("--resume: --rate 0.3 (the run used 0.9), --mode a (the run used b): ")
    assert "\n" not in str(refused.value) and "another --output" in str(refused.value)
    with pytest.raises(BertkitError, match="--source .*other.txt .the run used"):
        parse("--output", tmp_path, "--resume", "--source", tmp_path / "other.txt")
    with pytest.raises(BertkitError, match="--kind y .the run used x."):  # a default the run kept counts too
        parse("--output", tmp_path, "--resume", "--kind", "y")
    monkeypatch.chdir(tmp_path)
    cfg, _ = parse("--output", tmp_path, "--resume", "--rate", 0.9, "--source", "data.txt", "--count", 12)
    assert (cfg.inner.rate, cfg.source, cfg.count) == (0.9, "data.txt", 12)


@dataclass
class Prepared:
    data: str = field(metadata={"help": "a prepared folder", "positional": True})
    rate: float = field(default=0.5, metadata={"help": "a rate"})
    output: str = field(default="out", metadata={"help": "where to"})
    resume: bool = field(default=False, metadata={"help": "go on"})


def test_resume_from_another_directory_takes_the_runs_own_data(tmp_path, monkeypatch):
    """A run's relative paths are saved as typed, relative to the directory it was started in. Resumed from
    another one (`cd runs && bertkit pretrain run ../data -o tiny --resume`), its own data was refused as
    'data/ (the run used data/)', with a fix ('leave the flag out') that a positional DATA cannot take, and
    the same refusal came back in the first directory after a resume from the second. The saved output path
    says where the run was started from (the run folder as found now, less that path); a path naming the same
    file from there is the same value, another one is still refused, naming the positional as it is written."""
    (tmp_path / "data").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "run_config.json").write_text(json.dumps({"data": "data/", "output": "runs/a"}))
    p = argparse.ArgumentParser()
    add_options(p, Prepared)

    def resume(*argv):
        return from_args(p.parse_args([str(a) for a in argv]), Prepared)

    monkeypatch.chdir(tmp_path / "runs")
    cfg = resume("../data", "--output", "a", "--resume")
    assert cfg.data == "../data" and cfg.output == "a"
    with pytest.raises(BertkitError) as refused:
        resume("../other", "--output", "a", "--resume")
    message = str(refused.value)
    assert message.startswith("--resume: data ../other (the run used data/): ") and "--data" not in message
    assert "leave the flag out" not in message and f"give data as the run did ({tmp_path / 'data'})" in message
    with pytest.raises(BertkitError, match="--rate 0.1 .the run used 0.5.: .*leave the flag out"):
        resume("../data", "--output", "a", "--resume", "--rate", 0.1)
    # saved from there (as the resumed run writes it), resumed from the first directory again
    (tmp_path / "runs" / "a" / "run_config.json").write_text(json.dumps({"data": "../data", "output": "a"}))
    monkeypatch.chdir(tmp_path)
    assert resume("data", "--output", "runs/a", "--resume").data == "data"
    with pytest.raises(BertkitError, match="^--resume: data other "):
        resume("other", "--output", "runs/a", "--resume")


def test_resume_from_another_directory_reads_the_saved_paths_from_where_the_run_started(tmp_path, monkeypatch):
    """The paths a run saved that are not typed again (finetune's --train/--dev/--model/--test, embed's and
    rerank's folders, distill layers' --data and --teacher-cache) were read from the current directory:
    `finetune classify --train train.tsv --dev dev.tsv -o out`, then `cd sub && ... -o ../out --resume`
    stopped on a missing sub/train.tsv, or scored another dev.tsv of the same name. They are read from the
    start directory; a value given now, and the non-path settings, are kept as they are."""
    from bertkit.distill.config import LayersDistillConfig
    from bertkit.pretraining.run_config import RunConfig
    from bertkit.tasks.config import EmbedConfig, NerConfig, RerankConfig, TextTaskConfig

    (tmp_path / "sub").mkdir()
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    start = tmp_path.resolve()
    cases = [  # (config, saved paths, the positionals to give again)
        (TextTaskConfig, {"train": "train.tsv", "dev": "d/dev.tsv", "model": "tiny"}, []),
        (NerConfig, {"train": "train.txt", "test": "test.txt"}, []),
        (EmbedConfig, {"train": "beir/", "dev": "sts.tsv"}, []),
        (RerankConfig, {"train": "beir", "dev": "beir", "index": "x.index", "mining_model": "m"}, []),
        (LayersDistillConfig, {"data": "s.txt", "teacher_cache": "t.safetensors"}, []),
        (RunConfig, {"init_from": "hf"}, ["../data"]),
    ]
    for cls, paths, positionals in cases:
        saved = {"data": "data", "keep": 2, **paths, "output": "out", "text_column": "text.tsv"}
        (tmp_path / "out" / "run_config.json").write_text(json.dumps(saved))
        p = argparse.ArgumentParser()
        add_options(p, cls)
        cfg = from_args(p.parse_args([*positionals, "--output", "../out", "--resume"]), cls)
        for name, value in paths.items():  # the start's file, named from here
            assert (tmp_path / "sub" / getattr(cfg, name)).resolve() == start / value, (cls.__name__, name)
        if cls is TextTaskConfig:
            assert cfg.text_column == "text.tsv"  # a column name is no path
            given = from_args(p.parse_args(["--output", "../out", "--resume", "--dev", "../d/dev.tsv"]), cls)
            assert given.dev == "../d/dev.tsv"
        if cls is RunConfig:
            assert cfg.data == "../data"  # given again: as typed
    # the run resumed from sub/ saves its settings again, with -o ../out: resumed from the start once more, it
    # still reads the start's files (a relative "train.tsv" there is not "../train.tsv" saved from sub/)
    p = argparse.ArgumentParser()
    add_options(p, TextTaskConfig)
    (tmp_path / "out" / "run_config.json").write_text(json.dumps({"train": "train.tsv", "output": "out"}))
    again = from_args(p.parse_args(["--output", "../out", "--resume"]), TextTaskConfig)
    (tmp_path / "out" / "run_config.json").write_text(json.dumps({"train": again.train, "output": "../out"}))
    monkeypatch.chdir(tmp_path)
    assert Path(from_args(p.parse_args(["--output", "out", "--resume"]), TextTaskConfig).train).resolve() == \
        start / "train.tsv"
    (tmp_path / "out" / "run_config.json").write_text(json.dumps({"train": "train.tsv", "output": "out"}))
    assert from_args(p.parse_args(["--output", "out", "--resume"]), TextTaskConfig).train == "train.tsv"  # as saved


@dataclass
class Files:
    inputs: list[str] = field(metadata={"help": "the inputs", "positional": True})
    # a True default is turned off by --no-lower, or by its alias --cased
    lower: bool = field(default=True, metadata={"help": "lower-case", "flags": ["--lower", "--cased"]})


def test_a_list_argument_and_the_alias_of_a_boolean_flag():
    p = argparse.ArgumentParser()
    add_options(p, Files)
    assert from_args(p.parse_args(["a", "b"]), Files) == Files(["a", "b"], True)
    assert from_args(p.parse_args(["a", "--cased"]), Files) == Files(["a"], False)
    assert from_args(p.parse_args(["a", "--no-lower"]), Files) == Files(["a"], False)
    with pytest.raises(SystemExit):  # one or more
        p.parse_args([])


@pytest.mark.parametrize("text", ["", '{"source": "old", "cou', "[1, 2]", "\xff\xfe"])
def test_resume_with_an_unreadable_run_config_says_so_in_one_line(tmp_path, text):
    """A run_config.json cut by a kill or a full disk (or not an object): `--resume` died on a JSONDecodeError
    traceback. Now a BertkitError, the CLI's one line, naming the file."""
    (tmp_path / "run_config.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(BertkitError, match=r"^--resume: .*run_config.json is not a JSON object of settings"):
        parse("--output", tmp_path, "--resume")
