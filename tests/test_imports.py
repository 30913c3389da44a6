"""The import structure of bertkit/, as a contract the tests check (import-linter's layers and
acyclic contracts, written out here so that a failure names the import that broke it).

Every `import bertkit...` / `from bertkit... import` in the package counts, at module level or
inside a function: an import moved into a function to dodge a cycle is still a cycle.

    python tests/test_imports.py        prints the figures: modules, units, import edges, cycles

A *unit* is a top-level module or sub-package (`bertkit.features`, `bertkit.serve`), except where
LAYERS names a module inside a package on its own (`bertkit.finetune.metrics`, which retrieval's
evaluation shares with fine-tuning).
"""

from __future__ import annotations

import ast
import collections
import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bertkit"

# Highest first: a unit imports units of lower layers only, never one of its own layer or above.
LAYERS = [
    ["bertkit.cli"],
    ["bertkit.serve", "bertkit.demo"],
    ["bertkit.finetune", "bertkit.vocab_training"],
    ["bertkit.retrieval", "bertkit.pretraining"],
    ["bertkit.training"],
    ["bertkit.attention_view", "bertkit.fill_mask", "bertkit.electra_view", "bertkit.export", "bertkit.tracing"],
    ["bertkit.features"],
    ["bertkit.loading"],
    ["bertkit.quantization", "bertkit.electra_pretraining"],
    ["bertkit.fast", "bertkit.allocator"],
    ["bertkit.electra"],
    ["bertkit.heads"],
    ["bertkit.modeling"],
    ["bertkit.checkpoint", "bertkit.devices", "bertkit.pooling", "bertkit.vector_files",
     "bertkit.finetune.metrics", "bertkit.finetune.data"],
    ["bertkit.tokenizer", "bertkit.config", "bertkit.sentence_layout"],
    ["bertkit.chunked_attention", "bertkit.tokenizer_speed", "bertkit.basic_tokenizer", "bertkit.wordpiece", "bertkit.vocab", "bertkit.windows",
     "bertkit.default_model"],
    ["bertkit.workers", "bertkit.textfiles", "bertkit.options", "bertkit.dropout", "bertkit.cross_entropy"],
    ["bertkit.errors"],
]
ORACLES = ("transformers", "tokenizers", "sentence_transformers", "pytrec_eval")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(imported name, line) for every import statement in a module, wherever it stands."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
    return out


def graph() -> tuple[set[str], dict[str, dict[str, int]], dict[str, list]]:
    """(bertkit's modules, module -> {imported bertkit module: line}, module -> oracle imports)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges, oracles = {}, {}
    for name, path in files.items():
        found = {}
        for target, line in imports(ast.parse(path.read_text(encoding="utf-8"))):
            if target.split(".")[0] in ORACLES:
                oracles.setdefault(name, []).append((target, line))
            while target not in files and "." in target:  # `from bertkit.x import name` -> bertkit.x
                target = target.rsplit(".", 1)[0]
            if target in files and target not in (name, "bertkit"):
                found.setdefault(target, line)
        edges[name] = found
    return set(files) - {"bertkit"}, edges, oracles


def unit(module: str) -> str:
    named = [u for layer in LAYERS for u in layer if module == u or module.startswith(u + ".")]
    return max(named, key=len) if named else ".".join(module.split(".")[:2])


def cycles(nodes, edges) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each a cycle or several."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def unit_edges(edges) -> dict[str, set[str]]:
    out = collections.defaultdict(set)
    for a, targets in edges.items():
        for b in targets:
            if unit(a) != unit(b):
                out[unit(a)].add(unit(b))
    return out


def test_no_import_cycle_between_modules_or_units():
    modules, edges, _ = graph()
    assert cycles(modules, edges) == []
    assert cycles({unit(m) for m in modules}, unit_edges(edges)) == []


def test_every_unit_has_a_layer():
    modules, _, _ = graph()
    layered = {u for layer in LAYERS for u in layer}
    missing = sorted({unit(m) for m in modules} - layered)
    assert not missing, f"add these to tests/test_imports.py LAYERS: {missing}"


def test_layers_import_only_downwards():
    _, edges, _ = graph()
    rank = {u: i for i, layer in enumerate(LAYERS) for u in layer}
    wrong = [f"{a} (line {line}) imports {b}" for a, targets in sorted(edges.items()) for b, line in targets.items()
             if unit(a) != unit(b) and rank.get(unit(b), -1) <= rank.get(unit(a), -1)]
    assert wrong == []


# Issue 25 counted 135 import edges among 33 units (4.09 per unit) before the inference side was
# reorganised; after it, `python tests/test_imports.py` printed 41 units and 156 edges (3.80 per unit).
MAX_EDGES_PER_UNIT = 3.9


def test_units_import_fewer_units_than_before_the_inference_rework():
    modules, edges, _ = graph()
    units = {unit(m) for m in modules}
    n_edges = sum(len(v) for v in unit_edges(edges).values())
    assert n_edges / len(units) <= MAX_EDGES_PER_UNIT, figures()


def test_the_loader_is_a_chain_over_the_model_files():
    """bertkit.loading reads a directory through checkpoint, places it through devices, swaps its dense
    layers through quantization (int8, then the fast path: one call) and reads the layout and the
    vocabulary; it never reaches up to what uses it, nor around quantization to the fast path."""
    _, edges, _ = graph()
    allowed = {"bertkit.checkpoint", "bertkit.devices", "bertkit.electra", "bertkit.electra_pretraining",
               "bertkit.errors", "bertkit.heads", "bertkit.modeling", "bertkit.quantization", "bertkit.sentence_layout",
               "bertkit.tokenizer"}
    assert set(edges["bertkit.loading"]) <= allowed
    # features runs the encoder over windows; it hands the vectors to pooling and the cuts to windows
    assert set(edges["bertkit.features"]) <= {"bertkit.errors", "bertkit.loading", "bertkit.pooling",
                                              "bertkit.windows"}


def test_the_library_never_imports_the_oracles():
    _, _, oracles = graph()
    assert oracles == {}


@pytest.mark.parametrize("reader", [".from_pretrained(", "load_quantized(", '"architectures"'])
def test_model_directories_are_read_in_one_place(reader):
    """Inference loads through bertkit.loading; the directory's format is read by bertkit.checkpoint
    (config.json's fields by bertkit.config, the int8 file by bertkit.quantization). Training builds its models itself (the pre-training
    and fine-tuning runs), and a class's own `from_pretrained` is where it is defined."""
    allowed = {"bertkit/loading.py", "bertkit/checkpoint.py", "bertkit/quantization.py", "bertkit/config.py",
               "bertkit/pretraining/train.py", "bertkit/finetune/run.py", "bertkit/electra_pretraining.py",
               "bertkit/cli/model.py"}
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            code = line.split("#")[0]
            if code.strip().startswith(("def ", '"', "`")):
                continue
            # a tokenizer's or a config's own from_pretrained reads no weights
            calls = re.findall(r"(\w+)\.from_pretrained\(", code) if reader == ".from_pretrained(" else [reader]
            if reader in code and any(not c.endswith(("Tokenizer", "Config")) for c in calls):
                found.add(str(path.relative_to(PACKAGE.parent)))
    assert found - allowed == set()


def figures() -> str:
    modules, edges, _ = graph()
    units = {unit(m) for m in modules}
    between = unit_edges(edges)
    n_unit_edges = sum(len(v) for v in between.values())
    return (f"{len(modules)} modules, {sum(len(v) for v in edges.values())} import edges between modules; "
            f"{len(units)} units, {n_unit_edges} import edges between units ({n_unit_edges / len(units):.2f} per "
            f"unit); module cycles {cycles(modules, edges)}, unit cycles {cycles(units, between)}")


if __name__ == "__main__":
    print(figures())


def test_the_command_line_builds_without_loading_torch():
    """`bertkit --help` and the tokenizer commands start without torch: every option a command
    offers comes from torch-free modules (the config dataclasses, bertkit.options)."""
    import subprocess

    code = ("import sys; from bertkit.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout.strip()
    assert out == "[]"
