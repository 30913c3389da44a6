"""The README's module table is true to the tree: every module of bertkit/ is named in it, under its
package, and every name in it is a module that exists; each package's docstring names its own modules, all
of them and no other. Every `bertkit` command shown in README.md and
docs/*.md, and in the examples of each `--help`, is one the command line takes today, every file and dotted
name the pages and the code (docstrings, comments, messages) cite exists, and the README's Python block runs."""

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import shutil
from pathlib import Path

import numpy as np

from test_finetune import sentiment_run, tiny  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


def table_entries() -> list[tuple[str, str]]:
    """(package folder, module file) for every module named in the README's module table, in its order."""
    rows = []
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `(bertkit/|[a-z_]+/)` \| (.+?) \| ", line)
        if m:
            folder = "" if m.group(1) == "bertkit/" else m.group(1)
            rows += [(folder, name) for name in re.findall(r"`([a-z_0-9]+\.py)`", m.group(2))]
    return rows


def table_rows() -> set[tuple[str, str]]:
    return set(table_entries())


def tree_modules() -> set[tuple[str, str]]:
    package = ROOT / "bertkit"
    out = set()
    for path in package.rglob("*.py"):
        rel = path.relative_to(package)
        if rel.name == "__init__.py" and len(rel.parts) == 1:
            continue  # the public surface, described above the table
        if rel.name == "__init__.py" and not (path.stat().st_size > 0 and _has_code(path)):
            continue  # a package's docstring only
        folder = "" if len(rel.parts) == 1 else "/".join(rel.parts[:-1]) + "/"
        out.add((folder, rel.name))
    return out


def _has_code(path: Path) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body)


def test_every_module_is_in_the_readme_table():
    missing = sorted(f"{folder}{name}" for folder, name in tree_modules() - table_rows())
    assert missing == [], f"add these modules to README.md's module table: {missing}"


def test_every_module_in_the_readme_table_exists():
    gone = sorted(f"{folder}{name}" for folder, name in table_rows() - tree_modules())
    assert gone == [], f"README.md's module table names modules that do not exist: {gone}"


def test_every_module_is_in_the_readme_table_once():
    """One row says what a module is: a module named twice (two rows, two descriptions) fails here."""
    entries = table_entries()
    twice = sorted({f"{folder}{name}" for folder, name in entries if entries.count((folder, name)) > 1})
    assert twice == [], f"README.md's module table names these modules more than once: {twice}"


# --- each package's own table of contents ---------------------------------------------------

# how a package's docstring names one of its modules: `name.py` anywhere, or `name` in backticks
DOC_MODULE = re.compile(r"(?<![\w./])([a-z_][a-z0-9_]*)\.py\b|`([a-z_][a-z0-9_]*)`")


def package_contents(package: Path) -> set[str]:
    """The modules and subpackages of a package folder, by name (its `__init__` and `__main__` aside)."""
    names = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    return names - {"__init__", "__main__"}


def test_every_package_docstring_names_its_own_modules():
    """A package opens with its modules (`bertkit/text/__init__.py`: `basic_tokenizer`, `wordpiece`, ...): a
    reader who looks for one finds it there, and finds nothing that moved away. Each name the docstring
    gives as a module (`name.py`, or `name` in backticks) is a module of that package, and each module
    is named. A module moved to another package (pretraining's `corpus` to bertkit.data) or added
    without a word fails here, naming the package and the module."""
    wrong = []
    for init in sorted((ROOT / "bertkit").glob("*/__init__.py")):
        package = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        named = {a or b for a, b in DOC_MODULE.findall(doc)}
        have = package_contents(package)
        where = f"bertkit/{package.name}/__init__.py"
        wrong += [f"{where}: names {name}, not a module of bertkit.{package.name}" for name in sorted(named - have)]
        wrong += [f"{where}: does not name its module {name}" for name in sorted(have - named)]
    assert wrong == [], "\n".join(wrong)


# --- the commands the documentation shows ---------------------------------------------------

FENCE = re.compile(r"^```[\w-]*[ \t]*\n(.*?)^```", re.S | re.M)
PLACEHOLDERS = ("...", "|", "[-")  # `finetune classify ... --pooling mean`, `pair|regression`, a synopsis


COMMAND = re.compile(r"^(?:bertkit|torchrun .*?-m bertkit\.cli|python -m bertkit\.cli) (.*)$")
# what follows a command on its line: a comment, a pipe, a chain, a background job, a redirect, a remark
TAIL = re.compile(r"\s+#\s|\s+\|\s|\s+&&\s|\s+&(?:\s|$)|\s+[<>]\s?\S|\s{2,}\(")


def commands_in(text: str, where) -> list[tuple[str, str]]:
    """(where(line number), command line) for every `bertkit ...` line of `text`, `torchrun ... -m bertkit.cli`
    and `python -m bertkit.cli` written as `bertkit`, with what follows the command dropped."""
    out = []
    for i, line in enumerate(text.splitlines()):
        m = COMMAND.match(line.strip().removeprefix("$ "))
        if m:
            out.append((where(i), TAIL.split(m.group(1))[0]))
    return out


def documented_commands() -> list[tuple[str, str]]:
    """The commands in the code blocks of README.md and docs/*.md (continued lines joined)."""
    out = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for block in FENCE.finditer(text):
            first = text.count("\n", 0, block.start()) + 2
            out += commands_in(block.group(1).replace("\\\n", " "),
                               lambda i, first=first, page=page: f"{page.relative_to(ROOT)}:{first + i}")
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return subs[0].choices if subs else {}


def help_examples(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """The commands in the examples of every `bertkit ... --help`: its epilog's indented lines."""
    examples = "\n".join(line for line in (parser.epilog or "").splitlines() if line.startswith(" "))
    out = commands_in(examples, lambda i: f"`{parser.prog} --help`")
    for sub in dict.fromkeys(_subparsers(parser).values()):  # an alias maps to the same parser
        out += help_examples(sub)
    return out


def _leaf(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser the leading command words name."""
    for word in words:
        if word not in _subparsers(parser):
            break
        parser = _subparsers(parser)[word]
    return parser


def wrong_commands(parser: argparse.ArgumentParser, commands) -> list[str]:
    """A line each for the commands `parser` does not take: a complete line must parse as written; a line with a
    placeholder (`...`, `a|b`, a `[--flag]` synopsis) may name only options its command has."""
    wrong = []
    for where, cmd in commands:
        words = shlex.split(cmd)
        if not any(p in cmd for p in PLACEHOLDERS):
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    parser.parse_args(words)
            except SystemExit:
                wrong.append(f"{where}: bertkit {cmd}: {err.getvalue().strip().splitlines()[-1]}")
            continue
        leaf = _leaf(parser, [w for w in words if not w.startswith("-")])
        known = {s for a in leaf._actions for s in a.option_strings}
        for word in words:
            flag = word.strip("[]").split("=")[0]
            if flag.startswith("-") and flag not in known and not re.fullmatch(r"-[\d.,-]+", flag):
                wrong.append(f"{where}: bertkit {cmd}: {flag} is not an option of `{leaf.prog}`")
    return wrong


def test_every_documented_command_parses():
    """Each `bertkit` command a page shows is one the command line takes today. A renamed or removed option
    fails here, naming the page and line."""
    from bertkit.cli import build_parser

    commands = documented_commands()
    assert len(commands) > 100
    wrong = wrong_commands(build_parser(), commands)
    assert wrong == [], "\n".join(wrong)


def test_every_help_example_parses():
    """The examples at the end of each `--help` are commands the command line takes."""
    from bertkit.cli import build_parser

    parser = build_parser()
    examples = help_examples(parser)
    assert len(examples) > 40
    wrong = wrong_commands(parser, examples)
    assert wrong == [], "\n".join(wrong)


CITED_PATH = re.compile(r"(?:^|[\s(])((?:bertkit|tests|bench|docs|\.ci)/[\w./*-]+)")
CITED_NAME = re.compile(r"\bbertkit(?:\.[A-Za-z_]\w*)+")


def _resolves(name: str) -> bool:
    """Whether a dotted name is a module of bertkit, or an attribute chain inside one."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_file_and_name_the_docs_cite_exists():
    """A path (`bertkit/runtime/fast.py`, `tests/test_pretraining_*.py`) or a dotted name
    (`bertkit.runtime.fast.decide`) written in backticks in README.md or docs/*.md names something in the
    tree: a module moved or a function renamed fails here, naming the page and line."""
    wrong = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"`([^`\n]+)`", text):
            where = f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            for path in CITED_PATH.findall(m.group(1)):
                path = path.rstrip(".,:")
                if not any(ROOT.glob(path)):
                    wrong.append(f"{where}: no file {path}")
            wrong += [f"{where}: no {name}" for name in CITED_NAME.findall(m.group(1)) if not _resolves(name)]
    assert wrong == [], "\n".join(wrong)


# a dotted name in code, a docstring or a comment (not the tail of a file name: `FOLDER/.bertkit.lock`)
CODE_NAME = re.compile(r"(?<![\w./-])bertkit(?:\.[A-Za-z_]\w*)+")
FILE_NAME = re.compile(r"\.(log|txt|json|lock|tmp)$")  # `cell / "bertkit.log"`: a file, when it names no module


def test_every_file_and_name_the_code_cites_exists():
    """What a reader follows from the code as from the pages: every dotted name (`bertkit.model.checkpoint`,
    `bertkit.training.optim.build_optimizer`) and every path (`tests/test_trace.py`, `docs/benchmarks.md`)
    written in bertkit/, bench/ or docs/*.py (docstrings, comments, messages, imports) names something in
    the tree. A module moved or a function renamed while a docstring elsewhere still points at the old
    place fails here, naming the file and line."""
    wrong, cited = [], 0
    for path in sorted([*(ROOT / "bertkit").rglob("*.py"), *(ROOT / "bench").glob("*.py"), *(ROOT / "docs").glob("*.py")]):
        text = path.read_text(encoding="utf-8")
        for m in [*CODE_NAME.finditer(text), *CITED_PATH.finditer(text)]:
            cited += 1
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            if m.re is CODE_NAME and not _resolves(m.group(0)) and not FILE_NAME.search(m.group(0)):
                wrong.append(f"{where}: no {m.group(0)}")
            elif m.re is CITED_PATH and not any(ROOT.glob(m.group(1).rstrip(".,:;)"))):
                wrong.append(f"{where}: no file {m.group(1)}")
    assert cited > 1000 and wrong == [], "\n".join(wrong)


# a file and the name inside it, as the guide writes them: "`bertkit/model/modeling.py`, `BertLayer.forward`",
# "`bertkit/text/basic_tokenizer.py` (`basic_words`: ...)", "`bertkit/model/modeling.py`: `pool_sentence()`";
# not a list of files ("`bertkit/serve/limits.py`, `requests.py`")
FILE_AND_NAME = re.compile(r"`(bertkit/[\w/]+)\.py`(?:'s)?[,:]?\s+\(?`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?<!\.py)(?:\([^`]*\))?`")


def _defines(module: str, name: str) -> bool:
    """Whether `module` has the dotted attribute `name` (a package: or a submodule of that name)."""
    obj = importlib.import_module(module.removesuffix(".__init__"))
    if importlib.util.find_spec(f"{obj.__name__}.{name.split('.')[0]}") if hasattr(obj, "__path__") else False:
        return True
    for attr in name.split("."):
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def test_every_name_the_docs_place_in_a_file_is_in_it():
    """Where a page or a docstring sends the reader to a file and a name in it ("`bertkit/model/modeling.py`,
    `BertEmbeddings.forward`"), the file defines that name: a function that moved to another module while the
    page kept the old file (the pre-training page sent the reader to `bertkit/pretraining/train.py` for
    `train_loop`, which lives in `bertkit/training/loop.py`) fails here."""
    wrong, seen = [], 0
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bertkit").rglob("*.py"))]
    for page in files:
        text = page.read_text(encoding="utf-8")
        for m in FILE_AND_NAME.finditer(text):
            seen += 1
            if not _defines(m.group(1).replace("/", "."), m.group(2)):
                where = f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
                wrong.append(f"{where}: {m.group(1)}.py has no {m.group(2)}")
    assert seen > 15 and wrong == [], "\n".join(wrong)


def test_the_readmes_python_block_runs(sentiment_run, tmp_path, monkeypatch):  # noqa: F811
    """README.md's "In Python" block runs as written, with `clf/` a fine-tuned classifier (the tiny one of
    tests/test_finetune.py), and gives what its comments say."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^In Python:\n\n```python\n(.*?)^```", text, re.S | re.M).group(1)
    shutil.copytree(sentiment_run[0] / "out", tmp_path / "clf")
    monkeypatch.chdir(tmp_path)
    names = {}
    exec(compile(block, "README.md", "exec"), names)
    out, vectors, tokens = names["out"], names["vectors"], names["tokens"]
    assert out.last_hidden_state.shape == (2, names["batch"]["input_ids"].shape[1], 384)
    assert out.pooler_output.shape == (2, 384) and len(out.hidden_states) == 7
    assert vectors.shape == (2, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert tokens.shape == (4, 384)  # [CLS] a sentence [SEP]
    assert names["preds"][0]["label"] in ("neg", "pos") and names["loaded"].task == "classify"


def test_the_features_pages_python_blocks_run_and_give_the_shapes_they_say(tmp_path, monkeypatch):
    """docs/features.md's Python blocks (embedding options, a per-token file read with safetensors alone, the
    attention map) run as written, with `texts` a list of three sentences (the file made from them by the command
    its comment shows) and bertviz's `head_view` a stand-in, and give the shapes and indices their comments say."""
    from bertkit.cli import main

    text = (ROOT / "docs" / "features.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sentences.txt").write_text("A man is eating food.\nA man rides a horse.\n")
    assert main(["embed", "sentences.txt", "-o", "tokens.safetensors", "--pooling", "none", "--quiet"]) == 0
    shown = {}
    names = {"texts": ["A man is eating food.", "A man rides a horse.", "Bert notices the hat."],
             "head_view": lambda **view: shown.update(view)}
    for block in blocks:
        exec(compile(block, "docs/features.md", "exec"), names)
    assert names["vecs"].shape == (2, 384) and names["cls"].shape == (3, 384) and names["mixed"].shape == (3, 384)
    assert names["tokens"].shape[1] == 1536 and len(names["words"]) == 1 and names["words"][0].shape == (4, 384)
    assert names["vectors"].shape == (len(names["ids"]), 384) and names["ids"][0] == 101 and names["ids"][-1] == 102
    weights = names["m"].weights
    assert weights.shape == (6, 12, 25, 25) and np.allclose(weights.sum(-1), 1, atol=1e-5)
    assert names["he"] == 13 and names["m"].tokens[13] == "he"
    assert (tmp_path / "page.html").is_file() and (tmp_path / "heads.png").is_file()
    assert set(shown) == {"attention", "tokens", "sentence_b_start"}


def _serve_defaults() -> dict:
    """`bertkit serve`'s options: flag -> (default, choices); an option made from a settings field has None as
    argparse's default ("not given") and the field's default as its own."""
    from bertkit.cli import build_parser

    serve = _subparsers(build_parser())["serve"]
    return {s: (a.setting.default if hasattr(a, "setting") else a.default, a.choices)
            for a in serve._actions for s in a.option_strings}


def _same_default(shown: str, default) -> bool:
    """A default as a page writes it (`4194304`, `16,384`, `4 MiB`, `30 s`, `last`) against the parser's."""
    text = shown.replace(",", "").removesuffix(" s")
    if text.endswith(" MiB"):
        text = str(float(text.removesuffix(" MiB")) * 2**20)
    try:
        return default is not None and float(text) == float(default)
    except (TypeError, ValueError):
        return text == str(default)


def test_the_serving_pages_flags_and_defaults_are_the_servers():
    """docs/serving.md's synopsis of `bertkit serve` (every line of it, not only the first, which the command
    check above reads) and its table of limits name options the server has, with its defaults and choices: a
    renamed flag or a changed default fails here, naming it."""
    options = _serve_defaults()
    text = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    synopsis = re.search(r"^bertkit serve \[MODEL_DIR\].*?(?=^```)", text, re.S | re.M).group(0)
    wrong, shown = [], 0
    for flag, value in re.findall(r"(--[\w-]+)(?: ([^\s\]|]+(?:\|[^\s\]|]+)*))?", synopsis):
        shown += 1
        if flag not in options:
            wrong.append(f"synopsis: {flag} is not an option of bertkit serve")
        elif "|" in value:
            wrong += [f"synopsis: {flag} {v} is not a choice" for v in value.split("|")
                      if v not in (options[flag][1] or ())]
        elif value and not value.isupper() and not _same_default(value, options[flag][0]):
            wrong.append(f"synopsis: {flag} {value}, the server's default is {options[flag][0]}")
    for flag, value in re.findall(r"`(--[\w-]+)` \(([\d,.]+(?: MiB| s)?)[;)]", text):
        shown += 1
        if flag not in options or not _same_default(value, options[flag][0]):
            wrong.append(f"table: {flag} ({value}), the server's default is {options.get(flag, ('no such option',))[0]}")
    assert shown > 40 and wrong == [], "\n".join(wrong)
