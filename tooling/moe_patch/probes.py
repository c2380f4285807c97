"""Declared upstream probes: does a tree already contain a patch's feature?

A patch may carry a trailer ``Upstream-Probe: <probe> <arguments>``.  Textual
reverse-application only recognises our own change; a probe recognises the
*feature* even when upstream implemented it differently.  Probes read the
tree's Python with :mod:`ast` and never import it.

Probes:
  ``triton-no-specialize FILE KERNEL ARG...``
      the ``@triton.jit`` decorator of KERNEL in FILE lists every ARG in
      ``do_not_specialize``.
  ``kernel-param FILE KERNEL PARAM``
      the jit function KERNEL in FILE has a parameter named PARAM.
  ``defines FILE NAME``
      FILE defines a function, class or module-level name NAME.
  ``calls FILE FUNCTION CALLEE``
      the function FUNCTION in FILE calls CALLEE (a dotted name, e.g. ``tl.atomic_add``).

A patch whose lines a later patch of the series changes no longer reverse-applies on a
tree that has both; a probe still recognises it there.
"""

from __future__ import annotations

import ast
import shlex
from dataclasses import dataclass
from pathlib import Path

from .errors import PatchFormatError
from .patchfile import check_path


@dataclass
class ProbeResult:
    found: bool
    detail: str


def _function(tree_root: Path, file: str, name: str) -> ast.FunctionDef | None:
    try:
        module = ast.parse((tree_root / file).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _jit_keywords(function: ast.FunctionDef) -> dict[str, ast.expr]:
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("jit"):
            return {k.arg: k.value for k in decorator.keywords if k.arg}
    return {}


def _names(node: ast.expr | None) -> set[str]:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return {
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        }
    return set()


def triton_no_specialize(tree_root: Path, file: str, kernel: str, *args: str) -> ProbeResult:
    function = _function(tree_root, file, kernel)
    if function is None:
        return ProbeResult(False, f"{kernel} not found in {file}")
    marked = _names(_jit_keywords(function).get("do_not_specialize"))
    missing = [a for a in args if a not in marked]
    if missing:
        return ProbeResult(False, f"{kernel} specialises on {', '.join(missing)}")
    return ProbeResult(True, f"{kernel} already marks {', '.join(args)} do_not_specialize")


def kernel_param(tree_root: Path, file: str, kernel: str, param: str) -> ProbeResult:
    function = _function(tree_root, file, kernel)
    if function is None:
        return ProbeResult(False, f"{kernel} not found in {file}")
    params = [a.arg for a in function.args.args + function.args.kwonlyargs]
    if param in params:
        return ProbeResult(True, f"{kernel} already has parameter {param}")
    return ProbeResult(False, f"{kernel} has no parameter {param}")


def defines(tree_root: Path, file: str, name: str) -> ProbeResult:
    try:
        module = ast.parse((tree_root / file).read_text())
    except (OSError, SyntaxError, ValueError):
        return ProbeResult(False, f"{file} cannot be read")
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            named = {node.name}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            named = {t.id for t in targets if isinstance(t, ast.Name)}
        else:
            continue
        if name in named:
            return ProbeResult(True, f"{file} already defines {name}")
    return ProbeResult(False, f"{file} does not define {name}")


def calls(tree_root: Path, file: str, function: str, callee: str) -> ProbeResult:
    found = _function(tree_root, file, function)
    if found is None:
        return ProbeResult(False, f"{function} not found in {file}")
    for node in ast.walk(found):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == callee:
            return ProbeResult(True, f"{function} already calls {callee}")
    return ProbeResult(False, f"{function} does not call {callee}")


PROBES = {
    "triton-no-specialize": (triton_no_specialize, 3),
    "kernel-param": (kernel_param, 3),
    "defines": (defines, 2),
    "calls": (calls, 3),
}


def parse(declaration: str, patch_name: str) -> tuple[str, list[str]]:
    words = shlex.split(declaration)
    if not words or words[0] not in PROBES:
        raise PatchFormatError(
            f"patch {patch_name} declares an unknown Upstream-Probe {declaration!r}; "
            f"known probes: {', '.join(PROBES)}"
        )
    name, args = words[0], words[1:]
    if len(args) < PROBES[name][1]:
        raise PatchFormatError(f"patch {patch_name}: Upstream-Probe {name} needs more arguments")
    check_path(args[0], patch_name)
    return name, args


def run(declaration: str, tree_root: Path, patch_name: str) -> ProbeResult:
    name, args = parse(declaration, patch_name)
    return PROBES[name][0](tree_root, *args)
