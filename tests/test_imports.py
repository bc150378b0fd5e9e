"""The package's imports point one way: no import cycle among atgrpo's modules, and no module imports an
underscore name from outside its own package (docs/architecture.md)."""

from __future__ import annotations

import ast
import os

ROOT = os.path.join(os.path.dirname(__file__), "..", "atgrpo")


def _modules() -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = "atgrpo." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: str, mods: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import outside ``if TYPE_CHECKING:`` blocks, at module
    level or inside functions. ``from pkg import submodule`` counts as importing the submodule."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name in mods]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = node.module or "" if node.level == 0 else ".".join(
                parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            if node.module is None and all(s in mods for s in subs):
                out += [(s, []) for s in subs]
            elif base in mods:
                out.append((base, [a.name for a in node.names]))
    return out


def test_no_import_cycle():
    mods = _modules()
    graph = {m: {t for t, _ in _imports(m, p, mods) if t != m} for m, p in mods.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            assert state.get(t) != 1, "import cycle: " + " -> ".join(path[path.index(t):] + [t])
            if t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_no_underscore_name_imported_from_another_package():
    mods = _modules()
    for m, p in mods.items():
        package = m if p.endswith("__init__.py") else m.rsplit(".", 1)[0]
        for target, names in _imports(m, p, mods):
            if not (target == package or target.startswith(package + ".")):
                private = [n for n in names if n.startswith("_")]
                assert not private, f"{m} imports {private} from {target}"
