"""What the `bertkit` command decides for its own process before torch loads (issue 41 items 2, 10)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

from bertkit.cli import process_settings


def test_a_passive_wait_policy_and_a_calm_bar_off_a_terminal():
    env = {}
    assert process_settings(env, terminal=False) == {"OMP_WAIT_POLICY": "PASSIVE", "TQDM_MININTERVAL": "30"}
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "TQDM_MININTERVAL": "30"}
    env = {}
    assert process_settings(env, terminal=True) == {"OMP_WAIT_POLICY": "PASSIVE"}  # a terminal redraws as usual


def test_what_the_user_set_is_kept():
    env = {"OMP_WAIT_POLICY": "ACTIVE", "TQDM_MININTERVAL": "1"}
    assert process_settings(env, terminal=False) == {} and env == {"OMP_WAIT_POLICY": "ACTIVE", "TQDM_MININTERVAL": "1"}


def test_the_settings_come_before_torch_loads():
    """The OpenMP runtime reads OMP_WAIT_POLICY once, when torch loads: `bertkit.cli` must not load torch,
    and the `bertkit` command's process has the setting in its environment when it runs a command."""
    code = ("import sys; import bertkit.cli; assert 'torch' not in sys.modules, 'bertkit.cli loads torch'; "
            "from bertkit.cli import main; sys.argv = ['bertkit', 'model', 'info']; main(); "
            "import os; print(os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "PASSIVE"


def test_the_serve_command_bounds_the_kernel_caches_where_the_user_has_not():
    from bertkit.cli.serve import KERNEL_CACHE_ENTRIES, bound_kernel_caches

    env = {"LRU_CACHE_CAPACITY": "1024"}
    assert bound_kernel_caches(env) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(KERNEL_CACHE_ENTRIES)}
    assert env == {"LRU_CACHE_CAPACITY": "1024", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(KERNEL_CACHE_ENTRIES)}


# --- the environment is the command line's: the library neither writes nor reads it (issue 36 item 4) ---------

PACKAGE = Path(__file__).resolve().parent.parent / "bertkit"
BOUNDARY = "cli"  # bertkit/cli/: where the `bertkit` command reads the environment and sets its process up
# what the library may read itself: torchrun's description of the process it starts (rank, world size), which
# each process of a run must read where it runs (no command line stands between torchrun and every rank)
TORCHRUN = {"RANK", "WORLD_SIZE", "LOCAL_RANK"}


def environment_uses(root: Path) -> list[str]:
    """Every use of os.environ / os.getenv / os.putenv / os.unsetenv outside bertkit/cli/ that is not a read of
    a TORCHRUN variable by its literal name: `os.environ["RANK"]`, `os.environ.get("RANK")`, `"RANK" in os.environ`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == BOUNDARY:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0)):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
                    and node.attr in ("environ", "getenv", "putenv", "unsetenv", "environb")):
                continue
            up, key = parents.get(node), None
            if node.attr == "environ" and isinstance(up, ast.Subscript) and isinstance(up.ctx, ast.Load):
                key = up.slice
            elif node.attr == "environ" and isinstance(up, ast.Attribute) and up.attr == "get":
                call = parents.get(up)
                key = call.args[0] if isinstance(call, ast.Call) and call.args else None
            elif node.attr == "getenv":
                call = up
                key = call.args[0] if isinstance(call, ast.Call) and call.args else None
            elif node.attr == "environ" and isinstance(up, ast.Compare) and isinstance(up.ops[0], (ast.In, ast.NotIn)):
                key = up.left
            if not (isinstance(key, ast.Constant) and key.value in TORCHRUN):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {ast.unparse(up or node)[:60]}")
    return found


def test_the_library_leaves_the_environment_to_the_command_line():
    """Settings come in as values (`bertkit.runtime.fast.SpeedSettings`, the configs), decided at the command
    line from its options and the environment: a library function that wrote a variable (the server once wrote
    BERTKIT_ROW_BUCKETS, then the kernel caches) changed every later caller in the process, and one that read
    one was a switch no signature shows."""
    assert environment_uses(PACKAGE) == []


def test_the_environment_check_finds_a_write_and_a_read(tmp_path):
    (tmp_path / "bertkit" / "cli").mkdir(parents=True)
    (tmp_path / "bertkit" / "m.py").write_text(
        'import os\nrank = os.environ.get("RANK", "0")\nos.environ.setdefault("X", "1")\nfast = os.getenv("FAST")\n'
        'world = int(os.environ["WORLD_SIZE"])\nif "RANK" in os.environ:\n    os.environ["RANK"] = "1"\n')
    (tmp_path / "bertkit" / "cli" / "c.py").write_text('import os\nos.environ["Y"] = "2"\n')
    found = environment_uses(tmp_path / "bertkit")
    assert [f.split(" ")[0] for f in found] == ["bertkit/m.py:3", "bertkit/m.py:4", "bertkit/m.py:7"], found
