"""Imports run one way: no module of the tool imports, however indirectly, one that imports it
back; the command line reaches the library only through ``moe_patch.commands``; and the kernel
harness (torch, triton) is imported by one module, only when ``moe-patch tune`` runs.

The graph is read from the source with :mod:`ast`: every ``import`` counts, at module level,
inside a function or under ``if TYPE_CHECKING:``, since each is a dependency a reader follows.
"""

from __future__ import annotations

import ast
from pathlib import Path

import moe_patch
from moe_patch.cli import main

TOOL = Path(moe_patch.__file__).parent
HARNESS = ("moe_kernels", "moe_e2e")
# The modules that may import the harness, each only inside a function, and why.
HARNESS_USERS = {
    "moe_patch.commands.tune": "moe-patch tune times the kernels with the harness",
    "moe_patch.harness_trees": "the trees a device call carries are fingerprinted as the harness reads them",
}
# What a cli/<command>.py may import from the tool: its command's library function, the
# shared options and renderers, and the errors (exit codes) its --help lists.
CLI_MAY_IMPORT = ("moe_patch.commands.", "moe_patch.cli.options", "moe_patch.cli.render")
CLI_ALSO = {"moe_patch.errors"}


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file for every module of the package at ``root``."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, bool]]:
    """``(imported module, at module level)`` for every import in ``path``: a module of the
    package where it names one (``from . import x`` names ``pkg.x``), else what it names."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                stem = ".".join([*base, *([child.module] if child.module else [])])
                for alias in child.names:
                    candidate = f"{stem}.{alias.name}"
                    found.append((candidate if candidate in known else stem, top))
            else:
                nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, top and not nested)

    visit(ast.parse(path.read_text(), str(path)), True)
    return found


def graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    known = module_names(root)
    edges = {}
    for name, path in known.items():
        edges[name] = set()
        for target, _ in imports(name, path, known):
            while target and target not in known:
                target = target.rpartition(".")[0]  # pkg.mod.function -> pkg.mod
            if target and target != name:
                edges[name].add(target)
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the path that closes it, or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = "done"
        path.pop()
        return None

    for start in sorted(edges):
        if start not in state and (found := walk(start)):
            return found
    return None


def test_the_tool_has_no_import_cycle():
    edges = graph(TOOL)
    assert len(edges) > 50 and "moe_patch.commands.apply" in edges["moe_patch.cli.apply"]
    found = cycle(edges)
    assert found is None, "import cycle: " + " -> ".join(found)


def test_a_cycle_through_a_function_or_a_type_check_is_found(tmp_path):
    """The check sees the loops a module-level import graph would miss."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from .c import g\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
    )
    (package / "d.py").write_text("from .a import b\n")
    assert cycle(graph(package)) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    (package / "c.py").write_text("")
    assert cycle(graph(package)) is None


def test_the_harness_is_imported_by_tune_alone_and_never_at_module_level():
    known = module_names(TOOL)
    users = {}
    for name, path in known.items():
        for target, top in imports(name, path, known):
            if target.split(".")[0] in HARNESS:
                assert not top, f"{name} imports {target} when it is imported (torch, triton)"
                users.setdefault(name, set()).add(target)
    assert set(users) == set(HARNESS_USERS), users


def test_each_command_is_a_click_function_over_its_commands_module():
    """The one command layer: cli/<command>.py parses options and prints; what it does is
    ``moe_patch.commands.<command>``, which tests and other tools call with keywords."""
    known = module_names(TOOL)
    for name, command in main.commands.items():
        cli_module = command.callback.__module__
        assert f"moe_patch.commands.{name}" in known, f"{name} has no commands/{name}.py"
        library = {
            target
            for target, _ in imports(cli_module, known[cli_module], known)
            if target.startswith("moe_patch")
        }
        assert f"moe_patch.commands.{name}" in library, (cli_module, library)
        strays = {t for t in library if not t.startswith(CLI_MAY_IMPORT) and t not in CLI_ALSO}
        assert not strays, f"{cli_module} reaches past the command layer: {sorted(strays)}"
