"""Load vLLM's ``fused_moe_kernel`` Triton JIT function from a vLLM source tree.

Nothing of vLLM is imported: ``fused_moe.py`` is parsed with :mod:`ast`, the
``@triton.jit`` function ``fused_moe_kernel`` and every ``@triton.jit`` helper it
calls (transitively) are cut out verbatim together with the module-level names
they use, and the result is written to a generated module file that is then
imported.  Triton's ``JITFunction`` (and its interpreter) read the kernel source
through :func:`inspect.getsourcelines`, so the code must live in a real file.

The generated file keeps each function of ``fused_moe.py`` on its original line
number, so Triton errors and tracebacks point at the same lines as the tree.
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import importlib.util
import inspect
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

FUSED_MOE_REL = Path("vllm/model_executor/layers/fused_moe/fused_moe.py")
KERNEL_NAME = "fused_moe_kernel"

# vLLM re-exports triton through vllm.triton_utils; the generated module imports
# the real packages instead.
_TRITON_MODULES = {"triton", "triton.language", "vllm.triton_utils"}
_HEADER = "import triton\nimport triton.language as tl\n"
_BUILTIN_NAMES = set(dir(builtins))


class KernelLoadError(RuntimeError):
    """The kernel could not be extracted from the tree."""


def tree_constants(source: str) -> dict[str, Any]:
    """The module-level constants of a vLLM source file (``NAME = <number expression>``,
    upper-case names only), evaluated: what a lifted launcher rule reads besides its
    arguments."""
    allowed = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)
    constants: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.isupper()
            and all(isinstance(n, allowed) for n in ast.walk(node.value))
        ):
            continue
        value = eval(
            compile(ast.Expression(node.value), "<constant>", "eval"), {"__builtins__": {}}
        )
        if isinstance(value, (int, float)):
            constants[node.targets[0].id] = value
    return constants


def lifted_functions(source: str, name: str) -> list[str]:
    """Source of the module-level function ``name`` and of the module's functions it
    calls, directly or through them (empty: no such function): what executing a
    launcher rule cut out of a vLLM source file needs besides its constants."""
    defined = {
        node.name: node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)
    }
    order: list[str] = []
    pending = [name] if name in defined else []
    while pending:
        current = pending.pop()
        if current in order:
            continue
        order.append(current)
        pending += [
            node.id
            for node in ast.walk(defined[current])
            if isinstance(node, ast.Name) and node.id in defined and node.id not in order
        ]
    return [ast.get_source_segment(source, defined[n]) for n in order]


# What the series' rules (default config and launcher) see as the SM count without a GPU:
# an H200's, the GPU they were measured on and the device name dispatch reports then.
CPU_SM_COUNT = 132


class _SmCountPlatform:
    """Stands in for vLLM's ``current_platform`` in a lifted launcher rule: CUDA on
    Hopper, as the rules are measured."""

    @staticmethod
    def is_cuda() -> bool:
        return True

    @staticmethod
    def is_device_capability(capability: int) -> bool:
        return capability == 90

    @staticmethod
    def num_compute_units(device_index: int = 0) -> int:
        import torch

        if not torch.cuda.is_available():
            return CPU_SM_COUNT
        return torch.cuda.get_device_properties(device_index).multi_processor_count


@dataclass(frozen=True)
class LoadedKernel:
    """A ``fused_moe_kernel`` loaded from one vLLM tree."""

    tree: Path
    source_path: Path
    module_path: Path
    vllm_version: str | None
    kernel: Any  # triton.runtime.jit.JITFunction
    helpers: dict[str, Any]
    signature: inspect.Signature
    constexpr_params: tuple[str, ...]
    decorator_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(self.signature.parameters)

    def has_param(self, name: str) -> bool:
        return name in self.signature.parameters

    def param_default(self, name: str) -> Any:
        """Default value from the source, or ``inspect.Parameter.empty``."""
        return self.signature.parameters[name].default

    @property
    def has_swap_ab(self) -> bool:
        return self.has_param("SWAP_AB")

    @functools.cached_property  # launches ask on every call; the source is read once
    def has_split_k(self) -> bool:
        """Whether the kernel splits K over grid axis 1.  Every release declares a
        ``SPLIT_K`` parameter, but unpatched kernels ignore it (vLLM forces 1)."""
        function = getattr(self.kernel, "fn", self.kernel)
        return self.has_param("SPLIT_K") and "program_id(axis=1)" in inspect.getsource(function)

    @functools.cached_property
    def caps_pipeline_depth(self) -> bool:
        """Whether the tree's launcher caps a Swap-AB launch's ``num_stages`` at its
        K loop's length (moe-patch's ``pipeline_depth_for``)."""
        return "\ndef pipeline_depth_for(" in self.source_path.read_text()

    @functools.cached_property
    def split_k_rule(self) -> Any:
        """The tree launcher's own ``split_k_for(use_fp8_w8a8, split_k, num_programs,
        k_steps, device)``, lifted out of its source with the module's constants and run
        against the GPU's real SM count, so launches here split exactly where the tree's
        would (None: the tree has none)."""
        return self._launcher_rule("split_k_for")

    @functools.cached_property
    def fill_split_rule(self) -> Any:
        """The tree launcher's own ``split_k_to_fill(use_fp8_w8a8, swap_ab, num_programs,
        device)`` (moe-patch's: the K split of a tuned config that names no SPLIT_K, only
        where a Swap-AB grid leaves SMs idle), lifted likewise (None: the tree has none,
        and such a config launches unsplit, as vLLM's always did)."""
        return self._launcher_rule("split_k_to_fill")

    @functools.cached_property
    def resident_depth_rule(self) -> Any:
        """The tree launcher's own ``resident_depth_for(num_stages, num_programs,
        stage_bytes, device)`` (moe-patch's: fewer pipeline stages where that makes a
        Swap-AB grid resident at once), lifted likewise (None: the tree has none)."""
        return self._launcher_rule("resident_depth_for")

    @functools.cached_property
    def narrow_tile_rule(self) -> Any:
        """The tree launcher's own ``narrow_tile_pays(config, narrow_stages, num_rows,
        num_pairs, B, device)`` (moe-patch's: whether a launch of a default config that
        offers a narrow weight tile, ``NARROW_TILE_STAGES``, takes it), lifted likewise
        (None: the tree has none).  Without a GPU it sees an H200's SM count."""
        return self._launcher_rule("narrow_tile_pays")

    @functools.cached_property
    def narrow_block_n(self) -> int | None:
        """The narrow tile's width (the tree's ``NARROW_BLOCK_N``; None: no such tile)."""
        return tree_constants(self.source_path.read_text()).get("NARROW_BLOCK_N")

    def _launcher_rule(self, name: str) -> Any:
        source = self.source_path.read_text()
        functions = lifted_functions(source, name)
        if not functions:
            return None
        import torch
        import triton

        namespace: dict[str, Any] = {
            "Any": Any,
            "torch": torch,
            "triton": triton,
            "current_platform": _SmCountPlatform(),
            "envs": SimpleNamespace(VLLM_BATCH_INVARIANT=False),
            **tree_constants(source),
        }
        exec(compile("\n\n".join(functions), str(self.source_path), "exec"), namespace)
        return namespace[name]

    def runtime_non_specialized(self) -> dict[str, tuple[str, ...]]:
        """Parameter names Triton itself treats as ``do_not_specialize`` /
        ``do_not_specialize_on_alignment`` (read back from the JIT object, as a
        cross-check of :attr:`decorator_kwargs`)."""
        names = self.param_names
        out: dict[str, tuple[str, ...]] = {}
        params = getattr(self.kernel, "params", None)
        if params is not None:  # compiled JITFunction: per-parameter flags
            for attr in ("do_not_specialize", "do_not_specialize_on_alignment"):
                out[attr] = tuple(p.name for p in params if getattr(p, attr, False))
            return out
        kwargs = getattr(self.kernel, "kwargs", {}) or {}  # InterpretedFunction
        for attr in ("do_not_specialize", "do_not_specialize_on_alignment"):
            vals = kwargs.get(attr) or []
            out[attr] = tuple(names[v] if isinstance(v, int) else v for v in vals)
        return out

    def compiled_variant_count(self, device: Any = None) -> int:
        """How many specialisations Triton has compiled for ``device`` (CUDA only)."""
        caches = getattr(self.kernel, "device_caches", None)
        if caches is None:
            return 0
        if device is None:
            import torch

            device = torch.cuda.current_device()
        if device not in caches:
            return 0
        return len(caches[device][0])


# --------------------------------------------------------------------------- #
# AST helpers
# --------------------------------------------------------------------------- #


def _is_triton_jit(dec: ast.expr) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    if isinstance(target, ast.Attribute):
        return (
            target.attr == "jit"
            and isinstance(target.value, ast.Name)
            and (target.value.id == "triton")
        )
    return isinstance(target, ast.Name) and target.id == "jit"


def _jit_decorator(fn: ast.FunctionDef) -> ast.expr | None:
    for dec in fn.decorator_list:
        if _is_triton_jit(dec):
            return dec
    return None


def _decorator_kwargs(dec: ast.expr | None) -> dict[str, Any]:
    """Keyword arguments of ``@triton.jit(...)`` as literal values.

    A keyword whose value is not a literal is recorded as its source text
    wrapped in ``_Unevaluated``.
    """
    if not isinstance(dec, ast.Call):
        return {}
    out: dict[str, Any] = {}
    for kw in dec.keywords:
        if kw.arg is None:
            continue
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            out[kw.arg] = _Unevaluated(ast.unparse(kw.value))
    return out


@dataclass(frozen=True)
class _Unevaluated:
    source: str


def _bound_names(fn: ast.FunctionDef) -> set[str]:
    """Parameters and names assigned inside the function (its locals)."""
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
    return names


def _free_names(fn: ast.FunctionDef) -> list[str]:
    """Names the function (body, defaults, decorators) reads from globals."""
    local = _bound_names(fn)
    seen: dict[str, None] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id not in local and node.id not in _BUILTIN_NAMES:
                seen.setdefault(node.id)
    return list(seen)


def _stmt_free_names(stmt: ast.stmt) -> list[str]:
    value = getattr(stmt, "value", None)
    nodes = [value] if value is not None else []
    if isinstance(stmt, ast.AnnAssign):
        nodes.append(stmt.annotation)
    seen: dict[str, None] = {}
    for n in nodes:
        for node in ast.walk(n):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id not in _BUILTIN_NAMES:
                    seen.setdefault(node.id)
    return list(seen)


def _assigned_targets(stmt: ast.stmt) -> list[str]:
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, ast.AnnAssign):
        targets = [stmt.target]
    out = []
    for t in targets:
        for node in ast.walk(t):
            if isinstance(node, ast.Name):
                out.append(node.id)
    return out


@dataclass
class _ModuleIndex:
    path: Path
    source: str
    tree: ast.Module
    functions: dict[str, ast.FunctionDef]
    assignments: dict[str, ast.stmt]
    imports: dict[str, tuple[str, str | None]]  # local name -> (module, attr|None)


def _index_module(path: Path) -> _ModuleIndex:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    functions: dict[str, ast.FunctionDef] = {}
    assignments: dict[str, ast.stmt] = {}
    imports: dict[str, tuple[str, str | None]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef):
            functions[stmt.name] = stmt
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for name in _assigned_targets(stmt):
                assignments[name] = stmt
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                local = alias.asname or alias.name.split(".")[0]
                imports[local] = (alias.name if alias.asname else local, None)
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
            for alias in stmt.names:
                imports[alias.asname or alias.name] = (stmt.module, alias.name)
    return _ModuleIndex(path, source, tree, functions, assignments, imports)


def _segment(index: _ModuleIndex, node: ast.stmt) -> tuple[int, str]:
    """(first line, source text) of a top-level statement incl. decorators."""
    decorators = getattr(node, "decorator_list", [])
    start = min([node.lineno] + [d.lineno for d in decorators])
    lines = index.source.splitlines()
    return start, "\n".join(lines[start - 1 : node.end_lineno])


def _module_file(tree_root: Path, module: str) -> Path | None:
    rel = Path(*module.split("."))
    for cand in (tree_root / rel.with_suffix(".py"), tree_root / rel / "__init__.py"):
        if cand.is_file():
            return cand
    return None


# --------------------------------------------------------------------------- #
# Extraction
# --------------------------------------------------------------------------- #


@dataclass
class _Extraction:
    tree_root: Path
    # (path, name) -> (lineno, text)
    pieces: dict[tuple[Path, str], tuple[int, str]] = field(default_factory=dict)
    # emitted in dependency order (dependencies first)
    order: list[tuple[Path, str]] = field(default_factory=list)
    # local name in the generated module -> name defined in the source module
    aliases: dict[str, str] = field(default_factory=dict)
    indexes: dict[Path, _ModuleIndex] = field(default_factory=dict)

    def index(self, path: Path) -> _ModuleIndex:
        if path not in self.indexes:
            self.indexes[path] = _index_module(path)
        return self.indexes[path]

    def need(self, index: _ModuleIndex, name: str, chain: tuple[str, ...]) -> None:
        key = (index.path, name)
        if key in self.pieces:
            return
        if name in ("triton", "tl"):
            imp = index.imports.get(name)
            if imp is None or imp[0] in _TRITON_MODULES or imp[0] == "triton":
                return  # provided by the generated header
        if name in index.functions:
            fn = index.functions[name]
            if _jit_decorator(fn) is None:
                raise KernelLoadError(
                    f"{' -> '.join(chain + (name,))}: {name} in {index.path} is a "
                    "plain Python function, not a @triton.jit function"
                )
            self.pieces[key] = _segment(index, fn)
            for dep in _free_names(fn):
                self.need(index, dep, chain + (name,))
            self.order.append(key)
            return
        if name in index.assignments:
            stmt = index.assignments[name]
            self.pieces[key] = _segment(index, stmt)
            for dep in _stmt_free_names(stmt):
                self.need(index, dep, chain + (name,))
            self.order.append(key)
            return
        if name in index.imports:
            module, attr = index.imports[name]
            if module in _TRITON_MODULES or module.split(".")[0] == "triton":
                return  # triton.* names are reached through the header imports
            if module.split(".")[0] == "vllm" and attr is not None:
                path = _module_file(self.tree_root, module)
                if path is None:
                    raise KernelLoadError(f"cannot find module {module} in the tree")
                self.need(self.index(path), attr, chain + (name,))
                if attr != name:
                    self.aliases[name] = attr
                return
            raise KernelLoadError(
                f"{' -> '.join(chain)} uses {name!r}, imported from {module}; "
                "only triton and vllm-internal jit helpers/constants are supported"
            )
        raise KernelLoadError(
            f"{' -> '.join(chain)} uses {name!r}, which is not defined at module "
            f"level in {index.path}"
        )


def _render(ex: _Extraction, main: Path, origin: str) -> str:
    """Generated module text; pieces of ``main`` keep their line numbers."""
    header = f"# Generated by moe_kernels.loader from {origin}. Do not edit.\n" + _HEADER
    lines = header.splitlines()
    main_keys = sorted((k for k in ex.order if k[0] == main), key=lambda k: ex.pieces[k][0])
    other_keys = [k for k in ex.order if k[0] != main]
    # Pieces from other files come right after the header (they are
    # dependencies of main-file pieces), then the main file's pieces.
    for key in other_keys:
        lines += ["", f"# from {key[0]}", *ex.pieces[key][1].splitlines()]
    for local, real in ex.aliases.items():
        lines.append(f"{local} = {real}")
    aligned = True
    for key in main_keys:
        start, text = ex.pieces[key]
        if aligned and len(lines) < start - 1:
            lines += [""] * (start - 1 - len(lines))
        else:
            aligned = False
            lines.append("")
        lines += text.splitlines()
    return "\n".join(lines) + "\n"


def import_source(text: str, relative: str, module_name: str) -> ModuleType:
    """``text`` imported as ``module_name`` from the file ``relative`` under the cache
    (written atomically, once per content): Triton reads a kernel's source from its file."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = _cache_dir() / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        scratch = path.with_suffix(f".tmp{os.getpid()}")
        scratch.write_text(text)
        os.replace(scratch, path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[module_name]
        raise
    return module


def _cache_dir() -> Path:
    env = os.environ.get("MOE_KERNELS_CACHE")
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"moe_kernels-{os.getuid()}"


def tree_version(tree_root: Path) -> str | None:
    """The vLLM version a source tree says it is (`vllm/_version.py`, else `PKG-INFO`)."""
    vfile = tree_root / "vllm" / "_version.py"
    if vfile.is_file():
        m = re.search(
            r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", vfile.read_text()
        )
        if m:
            return m.group(1)
    pkg = tree_root / "PKG-INFO"
    if pkg.is_file():
        m = re.search(r"^Version:\s*(\S+)", pkg.read_text(), re.M)
        if m:
            return m.group(1)
    return None


_LOADED: dict[tuple[str, str], LoadedKernel] = {}


def load_fused_moe_kernel(
    tree_root: str | os.PathLike[str],
    kernel_name: str = KERNEL_NAME,
    source_rel: str | os.PathLike[str] = FUSED_MOE_REL,
) -> LoadedKernel:
    """Extract ``kernel_name`` (and its jit helpers) from a vLLM tree and import it.

    Results are cached per (file content, kernel name) within the process.
    """
    tree = Path(tree_root).resolve()
    src = tree / source_rel
    if not src.is_file():
        raise KernelLoadError(f"{src} does not exist (is {tree} a vLLM source tree?)")
    ex = _Extraction(tree)
    index = ex.index(src)
    if kernel_name not in index.functions:
        raise KernelLoadError(f"{kernel_name} not found in {src}")
    ex.need(index, kernel_name, ())
    text = _render(ex, src, str(src))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    cache_key = (digest, kernel_name)
    if cache_key in _LOADED and _LOADED[cache_key].tree == tree:
        return _LOADED[cache_key]

    relative = f"{digest}/vllm_fused_moe_{digest}.py"
    module = import_source(text, relative, f"_moe_kernels_gen_{digest}")
    module_path = _cache_dir() / relative
    kernel = getattr(module, kernel_name)
    fn_node = index.functions[kernel_name]
    helpers = {
        name: getattr(module, name)
        for (path, name) in ex.order
        if path == src and name != kernel_name and name in index.functions
    }
    py_fn = getattr(kernel, "fn", kernel)
    sig = inspect.signature(py_fn)
    constexprs = tuple(
        name
        for name, p in sig.parameters.items()
        if p.annotation is not inspect.Parameter.empty and ("constexpr" in str(p.annotation))
    )
    loaded = LoadedKernel(
        tree=tree,
        source_path=src,
        module_path=module_path,
        vllm_version=tree_version(tree),
        kernel=kernel,
        helpers=helpers,
        signature=sig,
        constexpr_params=constexprs,
        decorator_kwargs=_decorator_kwargs(_jit_decorator(fn_node)),
    )
    _LOADED[cache_key] = loaded
    return loaded
