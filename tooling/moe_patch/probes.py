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


PROBES = {
    "triton-no-specialize": (triton_no_specialize, 3),
    "kernel-param": (kernel_param, 3),
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
