"""docs/guide.md cannot drift: every code block in it runs here, and what it prints must be what the
guide shows.

The rules the guide is written to (so a reader can check them too):
- a ```python block runs in one namespace shared by the whole page, in a fresh temporary folder
  (the page's current directory); the ```text block right after it is what it prints;
- a ```console block holds `$ bertkit ...` commands, each followed by what it prints; they run
  through `bertkit.cli.main` in the same folder and must exit with 0;
- numbers are compared with a tolerance of one and a half units in their last printed digit
  (float32 sums differ across CPUs in the 7th digit), integers exactly, the text between numbers
  exactly up to runs of spaces; a line `...` stands for any number of lines (timings, long lists);
- `<!-- guide: tolerance X -->` just before a block widens the tolerance of its decimal numbers to X
  (relative, for numbers above 1): only for the outputs of the few-second training runs, whose last
  digits depend on the CPU's kernels and thread count.

`python tests/test_guide.py --update` runs the page and writes the outputs into it (an expected output
that still matches, `...` lines included, is left as written).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shlex
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "guide.md"]

FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*guide:\s*tolerance\s+([0-9.eE+-]+)\s*-->\s*$")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass
class Block:
    kind: str  # python | console
    code: str  # the python source, or the console block's text
    start: int  # offsets of the whole fence in the page (for --update)
    end: int
    line: int  # 1-based line of the opening fence
    tolerance: float | None = None
    expected: str | None = None  # python: the text block after it
    out_start: int | None = None
    out_end: int | None = None
    seconds: tuple = (0.0, 0.0)  # (wall, CPU) of its last run


def parse(page: str) -> list[Block]:
    fences = list(FENCE.finditer(page))
    blocks = []
    i = 0
    while i < len(fences):
        m = fences[i]
        kind = m.group(1)
        if kind in ("python", "console"):
            before = page[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = MARKER.search(before)
            block = Block(kind, m.group(2), m.start(), m.end(), page.count("\n", 0, m.start()) + 1,
                          float(marker.group(1)) if marker else None)
            if kind == "python" and i + 1 < len(fences):
                nxt = fences[i + 1]
                gap = page[m.end():nxt.start()]
                if nxt.group(1) == "text" and not gap.strip():
                    block.expected, block.out_start, block.out_end = nxt.group(2), nxt.start(), nxt.end()
                    i += 1
            blocks.append(block)
        i += 1
    return blocks


# --- comparing outputs -------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.strip("\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _decimals(number: str) -> int:
    mantissa = re.split(r"[eE]", number)[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def same_line(expected: str, actual: str, tolerance: float | None) -> bool:
    e_text, a_text = NUMBER.split(expected), NUMBER.split(actual)
    if len(e_text) != len(a_text):
        return False
    if any(" ".join(e.split()) != " ".join(a.split()) for e, a in zip(e_text, a_text)):
        return False
    for e, a in zip(NUMBER.findall(expected), NUMBER.findall(actual)):
        places = _decimals(e)
        if places == 0 and not re.search(r"[eE]", e):
            if int(e) != int(a):
                return False
            continue
        allowed = 1.5 * 10.0 ** -places if not re.search(r"[eE]", e) else 1e-3 * abs(float(e))
        if tolerance is not None:
            allowed = max(allowed, tolerance * max(1.0, abs(float(e))))
        if abs(float(e) - float(a)) > allowed + 1e-12:
            return False
    return True


def same_output(expected: str, actual: str, tolerance: float | None = None) -> bool:
    """Line by line as the module docstring says; `...` matches any run of lines."""
    exp, act = _lines(expected), _lines(actual)

    @functools.lru_cache(maxsize=None)
    def match(i: int, j: int) -> bool:
        if i == len(exp):
            return j == len(act)
        if exp[i].strip() == "...":
            return any(match(i + 1, k) for k in range(j, len(act) + 1))
        return j < len(act) and same_line(exp[i], act[j], tolerance) and match(i + 1, j + 1)

    return match(0, 0)


# --- running a page ------------------------------------------------------------------------


def run_python(block: Block, namespace: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.code, f"guide.md:{block.line}", "exec"), namespace)
    return out.getvalue()


def console_commands(text: str) -> list[tuple[str, str]]:
    """[(command, expected output)] of a console block."""
    commands = []
    for line in text.split("\n"):
        if line.startswith("$ "):
            commands.append([line[2:], []])
        elif commands:
            commands[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"console block text before its first `$ ` command: {line!r}")
    return [(cmd, "\n".join(out)) for cmd, out in commands]


def run_command(command: str) -> str:
    from bertkit.cli import main

    argv = shlex.split(command)
    assert argv[0] == "bertkit", f"the guide's console blocks run bertkit commands only, got {command!r}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv[1:])
    assert rc == 0, f"`{command}` exited with {rc}"
    return out.getvalue()


def run_page(path: Path, workdir: Path, update: bool = False):
    """Run every block of the page in `workdir`; a list of mismatches, and the updated page."""
    page = path.read_text(encoding="utf-8")
    blocks = parse(page)
    namespace = {"__name__": "__guide__"}
    problems, edits = [], []
    previous = Path.cwd()
    os.chdir(workdir)
    try:
        _run_blocks(path, blocks, namespace, problems, edits, update)
    except Exception:
        if not update:
            raise
        problems.append(traceback.format_exc())
        print(problems[-1], file=sys.stderr)  # keep what ran so far: the page is rewritten up to here
    finally:
        os.chdir(previous)
    for start, end, text in sorted(edits, reverse=True):
        page = page[:start] + text + page[end:]
    return blocks, problems, page


def _run_blocks(path, blocks, namespace, problems, edits, update) -> None:
    for block in blocks:
        wall, cpu = time.perf_counter(), time.process_time()
        _run_block(path, block, namespace, problems, edits, update)
        block.seconds = (time.perf_counter() - wall, time.process_time() - cpu)


def _run_block(path, block, namespace, problems, edits, update) -> None:
    if block.kind == "python":
        actual = run_python(block, namespace)
        if block.expected is None:
            if actual.strip():
                problems.append(f"{path.name}:{block.line}: prints but the guide shows no output:\n{actual}")
                if update:
                    edits.append((block.end, block.end, f"\n\n```text\n{actual.rstrip()}\n```"))
        elif not same_output(block.expected, actual, block.tolerance):
            problems.append(_diff(path, block.line, block.expected, actual))
            if update:
                edits.append((block.out_start, block.out_end, f"```text\n{actual.rstrip()}\n```"))
        return
    rebuilt, changed = [], False
    for command, expected in console_commands(block.code):
        actual = run_command(command)
        if same_output(expected, actual, block.tolerance):
            rebuilt.append(f"$ {command}\n{expected.rstrip()}" if expected.strip() else f"$ {command}")
        else:
            changed = True
            problems.append(_diff(path, block.line, expected, actual, command))
            rebuilt.append(f"$ {command}\n{actual.rstrip()}" if actual.strip() else f"$ {command}")
    if update and changed:
        edits.append((block.start, block.end, "```console\n" + "\n".join(rebuilt) + "\n```"))


def _diff(path, line, expected, actual, command=None) -> str:
    what = f" (`{command}`)" if command else ""
    return f"{path.name}:{line}{what}: the output differs\n--- guide\n{expected.rstrip()}\n--- now\n{actual.rstrip()}"


# --- the test ------------------------------------------------------------------------------


def test_comparison_rules():
    assert same_output("a 0.1234\nb 12", "a   0.1235\nb 12")  # within 1.5 units of the 4th decimal
    assert not same_output("a 0.1234", "a 0.1250")
    assert not same_output("b 12", "b 13")
    assert not same_output("a word", "a ward")
    assert same_output("x\n...\nz", "x\ny1\ny2\nz") and same_output("x\n...\nz", "x\nz")
    assert not same_output("x\n...\nz", "x\ny")
    assert same_output("loss 2.50", "loss 2.53", tolerance=0.05) and not same_output("loss 2.50", "loss 2.53")
    blocks = parse("<!-- guide: tolerance 0.1 -->\n```python\nprint(1)\n```\n\n```text\n1\n```\n```console\n$ bertkit x\n```\n")
    assert [b.kind for b in blocks] == ["python", "console"] and blocks[0].expected == "1\n"
    assert blocks[0].tolerance == 0.1 and blocks[1].tolerance is None


def test_guide_runs_and_prints_what_it_shows(default_model_dir, tmp_path):
    import torch

    threads = torch.get_num_threads()
    # one thread: the page's models are tiny, and on a shared machine two threads wait on each other
    torch.set_num_threads(1)
    try:
        for path in PAGES:
            blocks, problems, _ = run_page(path, tmp_path)
            assert len(blocks) >= 20, f"{path.name}: only {len(blocks)} runnable blocks found"
            assert not problems, "\n\n".join(problems)
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    if "--update" not in sys.argv[1:]:
        raise SystemExit("usage: python tests/test_guide.py --update   (the test itself runs under pytest)")
    import torch

    torch.set_num_threads(1)  # as the test runs it: the training blocks' last digits depend on the thread count
    for path in PAGES:
        with tempfile.TemporaryDirectory() as tmp:
            blocks, problems, page = run_page(path, Path(tmp), update=True)
        path.write_text(page, encoding="utf-8")
        print(f"{path.relative_to(ROOT)}: {len(blocks)} blocks, {len(problems)} outputs rewritten")
        for block in sorted(blocks, key=lambda b: -b.seconds[1])[:8]:
            print(f"  line {block.line:4d} {block.kind:8s} {block.seconds[0]:6.1f} s wall {block.seconds[1]:6.1f} s CPU")


def test_figure_projection():
    """docs/make_guide_figures.py's PCA: points on a tilted plane in 6-D keep their distances in 2-D."""
    import importlib.util

    import numpy as np

    spec = importlib.util.spec_from_file_location("make_guide_figures", ROOT / "docs" / "make_guide_figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    rng = np.random.default_rng(0)
    plane = np.linalg.qr(rng.normal(size=(6, 2)))[0]  # an orthonormal basis of a plane in 6-D
    points = rng.normal(size=(10, 2)) @ plane.T + 3.0
    xy = figures.pca_2d(points)
    distances = lambda a: np.linalg.norm(a[:, None] - a[None], axis=-1)  # noqa: E731
    assert xy.shape == (10, 2) and np.allclose(distances(xy), distances(points), atol=1e-9)


def test_figure_parameter_counts():
    """docs/make_guide_figures.py's layer-block counts add up to the model's parameters, on a tiny odd model."""
    import importlib.util

    from bertkit.model.config import BertConfig
    from bertkit.model.modeling import BertModel

    spec = importlib.util.spec_from_file_location("make_guide_figures", ROOT / "docs" / "make_guide_figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    H, I, V, P = 12, 20, 50, 16
    model = BertModel(BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=3, num_attention_heads=3,
                                 intermediate_size=I, max_position_embeddings=P))
    n = figures.parameter_counts(model)
    assert n["attention: Q, K, V"] == 3 * (H * H + H) and n["attention: output W_O"] == H * H + H
    assert n["feed-forward W1 (H -> I)"] == H * I + I and n["feed-forward W2 (I -> H)"] == I * H + H
    parts = [v for k, v in n.items() if k.startswith(("attention", "LayerNorm", "feed-forward"))]
    assert sum(parts) == n["one layer"]
    assert n["layers"] * n["one layer"] + n["embeddings"] + n["pooler"] == n["model"] == model.num_parameters()
