"""The README's module table is true to the tree: every module of bertkit/ is named in it, under its
package, and every name in it is a module that exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def table_rows() -> set[tuple[str, str]]:
    """(package folder, module file) for every module named in the README's module table."""
    rows = set()
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `(bertkit/|[a-z_]+/)` \| (.+?) \| ", line)
        if m:
            folder = "" if m.group(1) == "bertkit/" else m.group(1)
            rows |= {(folder, name) for name in re.findall(r"`([a-z_0-9]+\.py)`", m.group(2))}
    return rows


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
    import ast

    body = ast.parse(path.read_text(encoding="utf-8")).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body)


def test_every_module_is_in_the_readme_table():
    missing = sorted(f"{folder}{name}" for folder, name in tree_modules() - table_rows())
    assert missing == [], f"add these modules to README.md's module table: {missing}"


def test_every_module_in_the_readme_table_exists():
    gone = sorted(f"{folder}{name}" for folder, name in table_rows() - tree_modules())
    assert gone == [], f"README.md's module table names modules that do not exist: {gone}"
