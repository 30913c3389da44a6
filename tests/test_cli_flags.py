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


# --- numbers: what every option of a kind takes ------------------------------------------------------------

def options_of(kind):
    """(command, flag) of every option whose value is `kind`: 'float' (a float type) or 'seed' (--seed)."""
    for path, parser in leaves(build_parser()):
        for action in parser._actions:
            if not action.option_strings or action.type in (None, str):
                continue
            if kind == "seed" and "--seed" in action.option_strings:
                yield path, "--seed"
            elif kind == "float" and (action.type is float or getattr(action.type, "__name__", "") == "finite_float"):
                yield path, action.option_strings[0]


FLOAT_OPTIONS = sorted(set(options_of("float")))
PARSER = build_parser()  # one, for the walks: parsing does not change it


def parse_error(argv, capsys) -> str:
    """What parsing `argv` (no command runs) prints when it stops with exit code 2; '(parsed)' when it does not.
    A value is read before any missing argument is looked for, so the command's other arguments are not needed."""
    try:
        PARSER.parse_args(argv)
    except SystemExit as stop:
        return capsys.readouterr().err.strip() if stop.code == 2 else f"(exit {stop.code})"
    return "(parsed)"


def test_the_walk_finds_the_float_options():
    flags = {flag for _, flag in FLOAT_OPTIONS}
    assert {"--epochs", "--learning-rate", "--alpha", "--bm25-k1", "--mask-prob", "--max-wait-ms"} <= flags
    assert len(FLOAT_OPTIONS) > 100  # the training settings of every finetune task, distill and pretrain


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
def test_every_float_option_refuses_what_is_no_finite_number(value, capsys):
    """nan passes every check written `x < 0` and inf every `x > 0`: --weight-decay nan and --learning-rate inf
    trained (on nan weights), --epochs inf and --adam-epsilon nan were tracebacks, --bm25-k1 inf wrote an
    index.json that could not be read back. Refused where the value is read, for every float option."""
    wrong = []
    for path, flag in FLOAT_OPTIONS:
        err = parse_error([*path.split(), f"{flag}={value}"], capsys)
        if f"argument {flag}" not in err or "not a finite number" not in err:
            wrong.append(f"bertkit {path} {flag}={value}: {err}")
    assert not wrong, "\n".join(wrong)


def test_a_float_option_still_takes_numbers(tmp_path):
    args = build_parser().parse_args(["finetune", "classify", "--train", "t", "-o", "o", "--learning-rate", "3e-5",
                                      "--epochs", "2"])
    assert (args.learning_rate, args.epochs) == (3e-5, 2.0)
    assert build_parser().parse_args(["finetune", "qa", "--train", "t", "-o", "o",
                                      "--null-score-diff-threshold=-1.5"]).null_score_diff_threshold == -1.5


@pytest.mark.parametrize("argv", [
    ["finetune", "classify", "--train", "t.tsv", "-o", "out", "--epochs", "inf"],
    ["index", "corpus", "-o", "ix", "--bm25-k1", "inf"],
])
def test_an_infinite_setting_is_one_line_before_any_work(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "not a finite number" in refused(argv, capsys)


SEED_OPTIONS = sorted(set(options_of("seed")))


def test_every_seed_takes_the_same_values(capsys):
    """A seed is an int in 0..2**32-1 in every command: numpy's generators refuse a negative one (`pretrain
    prepare --seed -1` was a ValueError traceback, `pretrain run` refused it, finetune and distill took it) and
    seed * 1_000_003 + epoch must stay inside torch's 64 bits."""
    assert {path for path, _ in SEED_OPTIONS} >= {"finetune classify", "pretrain prepare", "pretrain run", "demo",
                                                   "electra show", "distill static", "distill layers"}
    wrong = []
    for path, flag in SEED_OPTIONS:
        for value in ("-1", str(2**32), "1.5"):
            err = parse_error([*path.split(), f"{flag}={value}"], capsys)
            if "argument --seed" not in err:
                wrong.append(f"bertkit {path} --seed={value}: {err}")
        parser = dict(leaves(PARSER))[path]
        action = next(a for a in parser._actions if "--seed" in a.option_strings)
        assert action.type("0") == 0 and action.type(str(2**32 - 1)) == 2**32 - 1
    assert not wrong, "\n".join(wrong)


# --- one flag, one meaning: the same refusal wherever a flag is -------------------------------------------

def commands_with(flag):
    return [path for path, parser in leaves(PARSER) if any(flag in a.option_strings for a in parser._actions)]


@pytest.mark.parametrize("flag", ["--max-train-examples", "--max-dev-examples"])
def test_every_finetune_task_refuses_an_example_limit_below_one(flag, tmp_path, capsys):
    """finetune embed took 0 and -1 (its validate skipped the common checks): 0 was refused later as '1 training
    example: ... give at least 2 rows' and '1 scored pair(s)', -1 read the file without its last rows."""
    train = tmp_path / "train.tsv"
    train.write_text("anchor\tpositive\na\tb\n")
    tasks = commands_with(flag)
    assert "finetune embed" in tasks and "finetune classify" in tasks
    dev = ["--dev", str(train)] if flag == "--max-dev-examples" else []  # without --dev it is refused as unused
    for path in tasks:
        for value in ("0", "-1"):
            assert main([*path.split(), "--train", str(train), "-o", str(tmp_path / "o"), *dev,
                         f"{flag}={value}"]) == 2, path
            err = capsys.readouterr().err.strip()
            assert err == f"bertkit: error: {flag} must be >= 1 (leave it out for every example), got {value}", path


def test_relative_margin_takes_the_same_values_in_mine_and_finetune_rerank(tmp_path, capsys):
    """The same NV-Retriever margin: mine refused a negative one, finetune rerank took it (-1: a 'hard negative'
    could score twice the positive's cosine, the guard against unlabelled positives turned around)."""
    (tmp_path / "pairs.tsv").write_text("anchor\tpositive\na\tb\n")
    assert set(commands_with("--relative-margin")) == {"mine", "finetune rerank"}
    argv = {"mine": ["mine", str(tmp_path / "pairs.tsv"), "-o", str(tmp_path / "m.tsv"), "--model", str(tmp_path)],
            "finetune rerank": ["finetune", "rerank", "--train", str(tmp_path), "-o", str(tmp_path / "o")]}
    for path, words in argv.items():
        assert main([*words, "--relative-margin=-0.5"]) == 2, path
        assert capsys.readouterr().err.strip() == "bertkit: error: --relative-margin must be >= 0, got -0.5", path


def test_one_concept_is_asked_for_with_the_same_words_everywhere():
    """No progress bar was --quiet in embed, index, mine, evaluate retrieval, pretrain prepare and distill static,
    --no-progress in finetune, demo and distill layers: the other word was 'unrecognized arguments'. The table's
    text column was embed's --column, --text-column in finetune and predict. Each command takes both spellings,
    meaning the same."""
    wrong = []
    for path, parser in leaves(PARSER):
        dest = {flag: a.dest for a in parser._actions for flag in a.option_strings}
        # (a word, the word a command with it takes too): --column is embed's old name, never needed elsewhere
        for word, also in (("--quiet", "--no-progress"), ("--no-progress", "--quiet"), ("--column", "--text-column")):
            if word in dest and dest[word] != dest.get(also):
                wrong.append(f"bertkit {path}: {word} without {also} meaning the same")
    assert not wrong, "\n".join(wrong)
    args = PARSER.parse_args(["finetune", "classify", "--train", "t", "-o", "o", "--quiet"])
    assert args.progress is False
    args = PARSER.parse_args(["embed", "in.tsv", "-o", "v.npy", "--text-column", "sentence", "--no-progress"])
    assert (args.column, args.quiet) == ("sentence", True)


def test_every_option_says_what_it_does():
    missing = [f"bertkit {path} {a.option_strings or a.dest}" for path, parser in leaves(PARSER)
               for a in parser._actions if not a.help]
    assert not missing, missing


# --- a setting that cannot work: one line, before the data or the model is read ------------------------------

@pytest.mark.parametrize("argv, says", [
    # str.split's ValueError traceback, once the model had loaded
    (["multi-label", "--label-separator", ""],
     "--label-separator must not be empty: give the text between two labels, e.g. ','"),
    # a weight that is no positive number trained on a nan loss (nan) or pushed its dimensions apart (-1)
    (["embed", "--matryoshka-dims", "16,8", "--matryoshka-weights", "1,nan"],
     "--matryoshka-weights must be a comma-separated list of positive numbers, one per --matryoshka-dims, got '1,nan'"),
    (["embed", "--matryoshka-dims", "16,8", "--matryoshka-weights", "1,-1"],
     "--matryoshka-weights must be a comma-separated list of positive numbers, one per --matryoshka-dims, got '1,-1'"),
    (["embed", "--matryoshka-dims", "16,8", "--matryoshka-weights", "1"],
     "--matryoshka-weights must be a comma-separated list of positive numbers, one per --matryoshka-dims, got '1'"),
    (["embed", "--matryoshka-dims", "16,0"],
     "--matryoshka-dims must be a comma-separated list of positive whole numbers, got '16,0'"),
    # the flag the user typed, not '--articles'
    (["qa", "--train-articles", "a:b"], "--train-articles 'a:b' is not START:END (e.g. 0:40)"),
    (["qa", "--dev", "d.json", "--dev-articles", "1:2:3"], "--dev-articles '1:2:3' is not START:END (e.g. 0:40)"),
])
def test_a_setting_that_cannot_work_is_refused_before_anything_is_read(argv, says, tmp_path, capsys, monkeypatch):
    import bertkit.tasks.run

    monkeypatch.setattr(bertkit.tasks.run, "load_head", lambda *a, **k: pytest.fail("the model loaded"))
    train = tmp_path / "absent.tsv"  # never read: the settings are checked first
    assert main(["finetune", argv[0], "--train", str(train), "-o", str(tmp_path / "o"), *argv[1:]]) == 2
    assert capsys.readouterr().err.strip() == f"bertkit: error: {says}"


# --- counts: refused where they are typed, not once the model has loaded ----------------------------------------

# the hand-written int options where 0 or a negative number means something
NOT_COUNTS = {"--layer": "-1: the last layer", "--stride": "0: windows share nothing",
              "--overlap": "index's old name of --stride", "--opset": "a version: export onnx refuses one below 14 first"}


def test_every_count_a_command_defines_itself_refuses_zero_and_below_where_it_is_typed(capsys):
    """embed, predict, evaluate, mine and search took --batch-size 0 and fill-mask --top-k 0 and refused them only
    once the model had loaded (seconds for a big one), search --block-size 0 after opening the index. Every int
    option a command adds by hand (not from a settings dataclass, whose validate checks it first) is a count."""
    wrong = []
    for path, parser in leaves(PARSER):
        for action in parser._actions:
            flag = action.option_strings[0] if action.option_strings else None
            if (flag is None or getattr(action.type, "__name__", None) not in ("int", "count") or flag in NOT_COUNTS
                    or hasattr(action, "setting")):  # a settings field: its config's validate checks it first
                continue
            for value in ("0", "-1"):
                if "must be at least 1" not in parse_error([*path.split(), f"{flag}={value}"], capsys):
                    wrong.append(f"bertkit {path} {flag}={value}")
    assert not wrong, "\n".join(wrong)


def test_a_count_still_takes_its_numbers():
    args = PARSER.parse_args(["search", "ix", "q", "-k", "3", "--batch-size", "1", "--block-size", "64"])
    assert (args.k, args.batch_size, args.block_size) == (3, 1, 64)
    assert PARSER.parse_args(["evaluate", "retrieval", "d", "--dimensions", "64", "128"]).dimensions == [64, 128]


@pytest.mark.parametrize("argv, flag", [
    (["vocab", "train", "--vocab-size", "3"], "--vocab-size"),
    (["vocab", "train", "--min-frequency", "0"], "--min-frequency"),
    (["vocab", "train", "--max-distinct-words", "10"], "--max-distinct-words"),
    (["pretrain", "prepare", "--max-seq-length", "2"], "--max-seq-length"),
    (["pretrain", "prepare", "--short-seq-prob", "2"], "--short-seq-prob"),
    (["pretrain", "prepare", "--dupe-factor", "0"], "--dupe-factor"),
    (["pretrain", "prepare", "--workers", "-1"], "--workers"),
    (["pretrain", "prepare", "--masked-lm-prob", "0"], "--masked-lm-prob"),
    (["pretrain", "prepare", "--max-predictions-per-seq", "0"], "--max-predictions-per-seq"),
    (["pretrain", "prepare", "--max-ngram", "0"], "--max-ngram"),
    (["pretrain", "prepare", "--examples", "-1"], "--examples"),
])
def test_a_setting_out_of_range_is_named_as_the_user_typed_it(argv, flag, tmp_path, capsys):
    """vocab train and pretrain prepare said 'vocab_size must be ...', 'masked_lm_prob must be ...': the Python
    field, where finetune, pretrain run and serve name the flag; prepare took --examples -1."""
    (tmp_path / "corpus.txt").write_text("Some text. More text.\n")
    assert main([*argv[:2], str(tmp_path / "corpus.txt"), "-o", str(tmp_path / "out"), *argv[2:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bertkit: error: {flag} ") and err.count("\n") == 1, err


def test_a_flag_that_only_tunes_another_is_refused_without_it(tmp_path, capsys):
    """search --ef-search 64 without --ann ran the exact scan and ignored it: a user tuning recall saw nothing
    change. (attention's --occurrence without --token: tests/test_attention.py.)"""
    assert main(["search", str(tmp_path / "ix"), "a query", "--ef-search", "64"]) == 2
    assert capsys.readouterr().err == ("bertkit: error: --ef-search sets how far --ann's HNSW walk looks: give --ann "
                                       "too (the exact search without it scores every passage)\n")


@pytest.mark.parametrize("argv, says", [
    # index: the graph's settings without the graph (index.json had no "ann", and nothing said so)
    (["index", "{c}", "-o", "{o}", "--ann-m", "8"], "--ann-m sets the HNSW graph --ann hnsw builds: give --ann hnsw "
     "too (without it no graph is built)"),
    (["index", "add", "{o}", "--ef-construction", "50", "--ef-search", "20"], "--ef-construction and --ef-search set "
     "the HNSW graph --ann hnsw builds: give --ann hnsw too (without it no graph is built)"),
    # BM25's settings beside --no-lexical, which builds no BM25
    (["index", "{c}", "-o", "{o}", "--no-lexical", "--bm25-k1", "0.9"], "--bm25-k1 sets the lexical part's BM25, "
     "which --no-lexical leaves out: give one or the other"),
    # index add encodes nothing: a build's settings were ignored (`index add X --vectors int8` added no codes)
    (["index", "add", "{o}", "--vectors", "int8", "--passage-tokens", "16"], "--passage-tokens and --vectors set "
     "how a build encodes a corpus, and index add encodes nothing (it makes its parts from INDEX's own files): "
     "build again with bertkit index CORPUS -o INDEX --overwrite"),
    (["index", "add", "{o}", "--batch-size", "8", "--model", "m"], "--model and --batch-size set how a build "
     "encodes a corpus, and index add encodes nothing (it makes its parts from INDEX's own files): build again "
     "with bertkit index CORPUS -o INDEX --overwrite"),
    (["index", "export", "{o}", "--qdrant", "{q}", "--collection", "c", "--ann", "hnsw"], "--ann sets what a build "
     "makes, and index export copies INDEX as it is: bertkit index add INDEX adds a graph or a lexical part, bertkit "
     "index CORPUS -o INDEX --overwrite builds it again"),
    (["index", "add", "{o}", "--ann", "hnsw", "-o", "{q}"], "-o/--output sets the folder a build writes, and index "
     "add writes into INDEX itself: leave it out"),
    (["index", "add", "{o}", "--resume"], "--resume sets that a build goes on after a kill, and index add needs none "
     "(INDEX gains its record last: a kill leaves it as it was): leave it out"),
    # both: --overwrite was ignored, and a finished index was refused with "pass --overwrite to replace it"
    (["index", "{c}", "-o", "{o}", "--resume", "--overwrite"], "--resume continues an interrupted build and "
     "--overwrite starts it again: give one"),
    # search: --rerank-top without a reranker reranked nothing
    (["search", "{o}", "q", "--rerank-top", "5"], "--rerank-top sets how many documents --rerank's cross-encoder "
     "re-scores: give --rerank MODEL too"),
    (["search", "{o}", "q", "--ann", "--mode", "lexical"], "--ann sets how the dense run finds its passages, and "
     "--mode lexical ranks by BM25 alone: leave it out, or search with --mode dense or hybrid"),
    (["search", "{o}", "q", "--ann", "--block-size", "512"], "--block-size sets the exact scan's blocks, and --ann "
     "walks the HNSW graph instead: leave one of them out"),
    # search INDEX q --collection c searched INDEX, and the collection named was never looked at
    (["search", "{o}", "q", "--collection", "c"], "--collection names the Qdrant collection --qdrant searches: give "
     "--qdrant PATH|URL too, or leave it out"),
    (["evaluate", "retrieval", "{c}", "--rerank-top", "5"], "--rerank-top sets how many documents --rerank's "
     "cross-encoder re-scores: give --rerank MODEL too"),
    (["serve", "--index", "{o}", "--rerank-top", "5"], "--rerank-top sets how many documents --rerank's "
     "cross-encoder re-scores: give --rerank MODEL too"),
    (["evaluate", "retrieval", "{c}", "--index", "{o}", "--ann", "--mode", "lexical"], "--ann sets how the dense run "
     "finds its passages, and --mode lexical ranks by BM25 alone: leave it out, or search with --mode dense or "
     "hybrid"),
])
def test_an_option_given_without_the_one_it_tunes_is_refused_before_any_work(argv, says, tmp_path, capsys):
    """Each of these ran and ignored the option: the index had no graph, the search reranked nothing, index add
    wrote no int8 codes. Each is now one line naming what is missing, before anything is read (the paths named
    here do not exist)."""
    paths = {"{c}": str(tmp_path / "corpus"), "{o}": str(tmp_path / "ix"), "{q}": str(tmp_path / "q")}
    assert main([paths.get(a, a) for a in argv]) == 2
    assert capsys.readouterr().err == f"bertkit: error: {says}\n"
    assert not (tmp_path / "ix").exists() and not (tmp_path / "q").exists()


@pytest.mark.parametrize("argv, says", [
    (["finetune", "classify", "--max-dev-examples", "5"], "--max-dev-examples is used only with --dev: give --dev "
     "too, or leave --max-dev-examples out"),
    (["finetune", "ner", "--max-dev-examples", "5"], "--max-dev-examples is used only with --dev"),
    (["finetune", "qa", "--dev-articles", "0:2"], "--dev-articles is used only with --dev"),
    (["finetune", "qa", "--null-score-diff-threshold", "2"], "--null-score-diff-threshold is used only with "
     "--version-2-with-negative: give --version-2-with-negative too, or leave --null-score-diff-threshold out"),
    (["finetune", "embed", "--mini-batch-size", "8"], "--mini-batch-size is used only with --loss cached-mnrl"),
    (["finetune", "embed", "--loss", "cosent", "--mini-batch-size", "8"], "--mini-batch-size is used only with "
     "--loss cached-mnrl"),
    (["finetune", "embed", "--static-dim", "64"], "--static-dim is used only with --static"),
    (["finetune", "embed", "--dev-split", "test"], "--dev-split is used only with --dev"),
    (["finetune", "rerank", "--rerank-top", "5"], "--rerank-top is used only with --dev"),
    (["finetune", "rerank", "--rerank-dtype", "bfloat16"], "--rerank-dtype is used only with --dev"),
    (["finetune", "rerank", "--dev-split", "test"], "--dev-split is used only with --dev"),
    (["finetune", "rerank", "--mining-model", "{c}", "--mining-index", "{c}"], "--mining-model is not used beside "
     "--mining-index (a run with --mining-index never reads it): leave one of them out"),
    (["finetune", "rerank", "--relative-margin", "0.1", "--mining-index", "{c}"], "--relative-margin is not used "
     "beside --mining-index"),
])
def test_a_finetune_option_without_the_setting_it_tunes_is_refused(argv, says, tmp_path, capsys):
    """Each of these trained and ignored the option (no dev set to cut, a v1 SQuAD run with no null answer to
    threshold, an mnrl loss that embeds the whole batch at once, the index's answers mined instead of the model's):
    now one line naming what it needs, before the (missing) --train is read."""
    paths = {"{c}": str(tmp_path / "corpus")}
    assert main([paths.get(a, a) for a in argv] + ["--train", str(tmp_path / "t.tsv"), "-o", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith(f"bertkit: error: {says}")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, says", [
    (["--generator-size", "0.5"], "--generator-size is used only with --method electra: give --method electra too"),
    (["--disc-weight", "10"], "--disc-weight is used only with --method electra"),
    (["--method", "electra", "--generator-size", "0.5", "--init-from", "{m}"], "--generator-size is not used beside "
     "--init-from (a run with --init-from never reads it)"),
    (["--config", "mini", "--init-from", "{m}"], "--config is not used beside --init-from"),
    (["--eval-every", "0", "--eval-sequences", "16"], "--eval-sequences is used only when --eval-every is not 0"),
])
def test_a_pretrain_option_without_the_setting_it_tunes_is_refused(argv, says, tmp_path, capsys):
    """A BERT run trained without the ELECTRA generator --generator-size shaped; --init-from's checkpoint gave the
    shape --config named (and its generator --generator-size's); --eval-every 0 evaluated none of the sequences
    --eval-sequences asked for. One line each, before the (missing) data is looked for."""
    argv = [str(tmp_path / "model") if a == "{m}" else a for a in argv]
    assert main(["pretrain", "run", str(tmp_path / "data"), "-o", str(tmp_path / "o"), *argv]) == 2
    assert capsys.readouterr().err.startswith(f"bertkit: error: {says}")
    assert not (tmp_path / "o").exists()


# --- every declared need, refused through the command line ----------------------------------------------------
# Each command declares what its options need (`bertkit.errors.refuse_unneeded`): a dataclass field's "needs", or a
# table of a hand-written command. Below, every row of every table is given without what it needs, through the real
# parser: a row that no command reaches, or that a change stops refusing, fails here.


def _option(parser, dest):
    return next(a for a in parser._actions if a.dest == dest and a.option_strings)


def _typed(parser, dest) -> list[str]:
    """argv giving option `dest` a value its parser takes (a choice: the last, not the usual default)."""
    action = _option(parser, dest)
    if action.nargs == 0:
        return [action.option_strings[0]]
    value = {"fusion": "rrf"}.get(dest) or (list(action.choices)[-1] if action.choices else
                                             "0.5" if action.type is float or getattr(action.type, "__name__", "")
                                             == "finite_float" else "2" if action.type is not None else "x")
    return [action.option_strings[0], str(value)]


def _dataclass_cases():
    """(argv, flag, says) for every row of the "needs" of the dataclasses the commands are built from: the argv
    leaves the need unmet, and meets the flag's earlier needs (which would refuse first)."""
    from bertkit.options import defaults, fields, merge, needs_table
    from bertkit.pretraining.prepare import PrepareConfig
    from bertkit.pretraining.run_config import RunConfig
    from bertkit.serve.settings import ServeConfig
    from bertkit.tasks.registry import TASKS

    commands = [(["finetune", t.cli_name, "--train", "{t}", "-o", "{o}"], t.config, t.defaults) for t in TASKS.values()]
    commands += [(["pretrain", "run", "{t}", "-o", "{o}"], RunConfig, {}),
                 (["pretrain", "prepare", "{t}", "-o", "{o}"], PrepareConfig, {}), (["serve"], ServeConfig, {})]
    for words, cls, base in commands:
        parser = dict(leaves(PARSER))[_leaf(words)]
        shown = merge(defaults(cls), base)
        default = {f.name: _get_path(shown, path) for path, f, _ in fields(cls)}
        rows = needs_table(cls)
        for i, (flags, (name, wanted), says) in enumerate(rows):
            (dest, flag), = flags.items()
            if not any(a.dest == dest for a in parser._actions):  # a field this command does not offer (`hidden`)
                continue
            met = [a for earlier, need, _ in rows[:i] if dest in earlier for a in _met(parser, *need)]
            yield [*words, *met, *_unmet(parser, name, wanted, default[name]), *_typed(parser, dest)], flag, says


def _get_path(d, path):
    for k in path:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _met(parser, name, wanted) -> list[str]:
    """argv that gives setting `name` as need `wanted` (see `bertkit.errors.refuse_unneeded`) wants it."""
    if wanted is False:
        return []
    flag = _option(parser, name).option_strings[0]
    return _typed(parser, name) if wanted is None else [flag] if wanted is True else [flag, (
        wanted[0] if isinstance(wanted, tuple) else wanted)]


def _unmet(parser, name, wanted, default) -> list[str]:
    """argv that leaves setting `name` without what need `wanted` wants."""
    if wanted is False:
        return _typed(parser, name)
    if wanted is None or wanted is True:
        return [_option(parser, name).option_strings[0], "0"] if default else []
    wanted = wanted if isinstance(wanted, tuple) else (wanted,)
    if default not in wanted:
        return []
    return [_option(parser, name).option_strings[0], next(c for c in _option(parser, name).choices if c not in wanted)]


def _table_cases():
    """(argv, flag, says) for every option of every row of the tables the hand-written commands declare, the argv
    leaving the row's need unmet (a fact such as "lexical" by the options that make it)."""
    from bertkit.cli.evaluate import RETRIEVAL_NEEDS
    from bertkit.cli.features import ATTENTION_NEEDS
    from bertkit.cli.search import INDEX_NEEDS, QUERY_NEEDS
    from bertkit.distill.config import STATIC_NEEDS
    from bertkit.retrieval.config import FUSION_NEEDS

    build, add = ["index", "{c}", "-o", "{o}"], ["index", "add", "{o}"]
    export = ["index", "export", "{o}", "--qdrant", "{q}", "--collection", "c"]
    lexical = ["--mode", "lexical"]
    tables = [  # (table, argv, {need: argv leaving it unmet}; a need not named: unmet by default)
        (QUERY_NEEDS, ["search", "{o}", "q"], {("ann", False): ["--ann"], ("lexical", False): lexical, ("encodes", True):
                                               lexical, ("qdrant", False): ["--qdrant", "{q}", "--collection", "c"]}),
        (INDEX_NEEDS, build, {("command", ("build", "add")): export, ("command", "build"): add,
                              ("command", ("build", "export")): add, ("no_lexical", False): ["--no-lexical"]}),
        (RETRIEVAL_NEEDS, ["evaluate", "retrieval", "{c}"], {("lexical", False): ["--index", "{o}", *lexical],
                                                              ("encodes", True): lexical}),
        (ATTENTION_NEEDS, ["attention", "a text", "-o", "{o}"], {}),
        # through a Qdrant collection the search's mode is the one given, checked before anything is read
        (FUSION_NEEDS, ["search", "--qdrant", "{q}", "--collection", "c", "q"], {("mode", "hybrid"): ["--mode", "dense"],
                                                                                  ("fusion", "rrf"): ["--mode", "hybrid"]}),
        (STATIC_NEEDS, ["distill", "static", "{t}", "-o", "{o}", "--quiet"], {}),
    ]
    for table, words, unmet in tables:
        for flags, need, says in table:
            argv = unmet.get(need, [])
            argv = argv if argv[:1] == ["index"] else [*words, *argv]  # `index add` and `index export`: their own
            parser = dict(leaves(PARSER))[_leaf(argv)]
            for dest, flag in flags.items():
                yield [*argv, *_typed(parser, dest)], flag, says


def _leaf(argv) -> str:
    """The command words of `argv` (`finetune classify`, `evaluate retrieval`, `index`) as `leaves` names them."""
    names = dict(leaves(PARSER))
    return max((" ".join(argv[:n]) for n in (1, 2) if " ".join(argv[:n]) in names), key=len)


@pytest.mark.parametrize("argv, flag, says", [*_dataclass_cases(), *_table_cases()],
                         ids=lambda case: case if isinstance(case, str) and case.startswith("-") else "")
def test_every_declared_need_is_refused_through_the_command_line(argv, flag, says, tmp_path, capsys, monkeypatch):
    """An option given without what it tunes (a row of a command's table, or a field's "needs") is one line that
    names it in the row's words, before anything is read or written (none of the paths exists)."""
    import re

    monkeypatch.setattr("bertkit.cli.build_parser", lambda: PARSER)  # built once: ninety parsers took seconds
    paths = {"{t}": str(tmp_path / "t"), "{c}": str(tmp_path / "c"), "{o}": str(tmp_path / "o"), "{q}": str(tmp_path / "q")}
    assert main([paths.get(a, a) for a in argv]) == 2, argv
    err = capsys.readouterr().err
    assert err.startswith(f"bertkit: error: {flag}") and err.count("\n") == 1, (argv, err)
    assert all(words in err for words in re.split(r"\{\w+\}", says)), (argv, err)  # the row's own words
    assert not any((tmp_path / name).exists() for name in ("o", "q")), argv


def test_embed_does_not_offer_group_by_length(capsys):
    """embed draws its batches without duplicate texts, never by length: --no-group-by-length was taken, recorded in
    run_config.json and changed nothing. It is not offered (the other tasks' batches are grouped by length)."""
    assert "unrecognized arguments: --no-group-by-length" in refused(
        ["finetune", "embed", "--train", "t.tsv", "-o", "o", "--no-group-by-length"], capsys)
    assert PARSER.parse_args(["finetune", "classify", "--train", "t", "-o", "o", "--no-group-by-length"]).group_by_length \
        is False


def test_a_finetune_option_with_the_setting_it_tunes_is_taken(tmp_path):
    """The same flags beside what they tune still build the run's settings."""
    from bertkit.options import from_args
    from bertkit.tasks import task_config

    for argv, field, value in ((["qa", "--version-2-with-negative", "--null-score-diff-threshold", "2"],
                                "null_score_diff_threshold", 2.0),
                               (["embed", "--loss", "cached-mnrl", "--mini-batch-size", "8"], "mini_batch_size", 8),
                               (["classify", "--dev", "d.tsv", "--max-dev-examples", "5"], "max_dev_examples", 5)):
        args = PARSER.parse_args(["finetune", *argv, "--train", "t.tsv", "-o", str(tmp_path / "o")])
        cls, defaults = task_config(args.task)
        assert getattr(from_args(args, cls, defaults), field) == value


def test_every_commands_help_loads_no_torch():
    """`bertkit CMD --help` for all 29 commands, in one fresh process: each prints its help and exits 0 without
    importing torch (the handlers import it; building and parsing must not)."""
    import subprocess
    import sys

    code = ("import argparse, contextlib, io, sys\n"
            "from bertkit.cli import build_parser\n"
            "def leaves(p, path=()):\n"
            "    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]\n"
            "    if not subs:\n"
            "        yield path\n"
            "        return\n"
            "    for name, sub in subs[0].choices.items():\n"
            "        yield from leaves(sub, path + (name,))\n"
            "parser, done = build_parser(), 0\n"
            "for path in leaves(parser):\n"
            "    out = io.StringIO()\n"
            "    try:\n"
            "        with contextlib.redirect_stdout(out):\n"
            "            parser.parse_args([*path, '--help'])\n"
            "    except SystemExit as stop:\n"
            "        assert stop.code == 0 and out.getvalue().startswith('usage: bertkit ' + ' '.join(path)), path\n"
            "        done += 1\n"
            "print(done, 'torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    count, torch_loaded = result.stdout.split()
    assert int(count) == len(list(leaves(PARSER))) >= 29 and torch_loaded == "False"


def test_the_help_of_a_command_that_needs_an_extra_names_it():
    """`bertkit serve --help` did not say that serve needs the serve extra, nor `bertkit index --help` that the
    lexical part it builds by default needs the search extra: a base install learnt it from the error only."""
    import argparse

    def command(*path):
        parser = PARSER
        for name in path:
            parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        return parser

    assert "pip install 'bertkit[serve]'" in " ".join(command("serve").format_help().split())
    assert "pip install 'bertkit[onnx]'" in " ".join(command("export", "onnx").format_help().split())
    no_lexical = next(a for a in command("index")._actions if "--no-lexical" in a.option_strings)
    assert "pip install 'bertkit[search]'" in no_lexical.help


def test_traceback_shows_the_developer_what_the_one_line_hides(tmp_path, capsys, monkeypatch):
    """Every error is one line for a person; an OSError from deep inside a library (a refused connection, an
    EINVAL) kept no more, and a developer had no way to see where it came from. `bertkit --traceback COMMAND`
    prints Python's traceback above the same line and exit status; given after the command it is refused
    saying where it goes."""
    import errno

    import bertkit.cli.text as text

    def deep(args):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(text, "run_tokenize", deep)
    assert main(["tokenize", "hello"]) == 2
    plain = capsys.readouterr().err
    assert plain == "bertkit: error: Invalid argument\n"
    assert main(["--traceback", "tokenize", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "in deep" in err and err.endswith(plain)
    missing = str(tmp_path / "none")
    assert main(["--traceback", "predict", missing, missing]) == 2  # a BertkitError too
    err = capsys.readouterr().err
    assert "Traceback" in err and "BertkitError" in err and err.splitlines()[-1].startswith("bertkit: error: ")
    with pytest.raises(SystemExit):
        main(["tokenize", "hello", "--traceback"])
    assert "--traceback goes before the command: bertkit --traceback tokenize" in capsys.readouterr().err
