"""``moe-patch tune``: FP8 fused-MoE config tables for a model, tuned on this GPU.

The timing is the kernel harness's (``moe_kernels``, which needs torch and triton: the
``kernels`` extra).  This is the one module of moe-patch that imports it, and only when a
tune runs, so every other command works without them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..errors import NetworkError, UsageError
from ..model_config import moe_shape
from ..settings import Settings
from ..ui import progress

KERNELS_MISSING = "moe-patch tune needs torch and triton: pip install 'moe-patch[kernels]'"


@dataclass
class Tuned:
    report: dict  # moe-patch-tune.json, as written into ``out``
    token_counts: list[int]  # the Ms this run tuned, ascending
    out: Path


def tune(
    model: Path,
    tree: Path,
    out: Path,
    *,
    tp: int = 1,
    quant: str | None = None,
    token_counts: list[int] | None = None,
    routings: int | str = "auto",
    seed: int = 0,
    release: str = "auto",
    settings: Settings | None = None,
    on_discard: Callable[[list[str]], None] | None = None,
) -> Tuned:
    """Tune ``model`` (its config.json, or the folder holding it) at tensor-parallel size
    ``tp`` on ``tree``'s kernel; vLLM's config file and the report go into ``out`` after each
    M.  ``token_counts`` defaults to vLLM's grid (``moe_kernels.measure.VLLM_GRID``);
    ``release`` is auto, none or the path of the unpatched tree (:func:`release_tree`);
    ``on_discard`` hears which inputs differ from an earlier run in ``out``, whose results
    are then timed again."""
    settings = settings or Settings.resolve()
    shape = moe_shape(model, tp)
    try:
        from moe_kernels import FUSED_MOE_REL, KernelLoadError, measure, model_tune
    except ImportError:
        raise UsageError(KERNELS_MISSING) from None
    if measure.DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise UsageError(
            "moe-patch tune times kernels on a CUDA GPU and torch sees none here; run it on "
            "the GPU that will serve the model (TRITON_INTERPRET=1 runs it on the CPU, for tests)"
        )
    if not (tree / FUSED_MOE_REL).is_file():
        raise UsageError(f"{tree} is not a vLLM source tree: it has no {FUSED_MOE_REL}")
    token_counts = token_counts or list(measure.VLLM_GRID)
    kernel_shape = measure.Shape(
        shape.name, shape.experts, shape.topk, shape.hidden, shape.intermediate
    )
    with tempfile.TemporaryDirectory(prefix="moe-patch-tune-") as scratch:
        unpatched = release_tree(release, tree, Path(scratch), settings.index_url)
        with progress(len(token_counts), "tuning") as advance:
            try:
                report = model_tune.tune_model(
                    tree,
                    kernel_shape,
                    quant or shape.quant,
                    token_counts,
                    out,
                    routings=routings,
                    seed=seed,
                    on_result=lambda row: advance(1),
                    on_discard=on_discard,
                    release=unpatched,
                    series_version=__version__,
                    static_activations=shape.static_activations,
                )
            except KernelLoadError as exc:
                raise UsageError(f"cannot load fused_moe_kernel: {exc}") from None
    return Tuned(report, token_counts, out)


def release_tree(
    release: str, tree: Path, scratch: Path, index_url: str | None = None
) -> Path | None:
    """The unpatched tree ``--release`` names: None for none, the release of ``tree``'s
    version made in ``scratch`` through moe-patch's download cache for auto, else the path."""
    from moe_kernels import FUSED_MOE_REL

    if release == "none":
        return None
    if release != "auto":
        path = Path(release)
        if not (path / FUSED_MOE_REL).is_file():
            raise UsageError(
                f"--release {path} is not a vLLM source tree: it has no {FUSED_MOE_REL}"
            )
        return path
    from moe_kernels.loader import tree_version
    from packaging.version import InvalidVersion, Version

    from ..harness_trees import build_tree

    said = tree_version(tree)
    try:  # a local label (a patched wheel's +moe..., a build's +cu128) is the same release
        version = Version(said).public if said and not Version(said).is_devrelease else None
    except InvalidVersion:
        version = None
    if version is None:
        what = f"says it is {said}" if said else "does not say which vLLM it is"
        raise UsageError(
            f"{tree} {what}, not a vLLM release: name the unpatched tree with --release PATH, "
            "or --release none"
        )
    try:
        return build_tree(version, scratch / f"vllm-{version}", index_url)
    except NetworkError as exc:
        raise NetworkError(
            f"{exc.message} (--release auto fetches vLLM {version} once into moe-patch's "
            "cache); or name the unpatched tree with --release PATH, or --release none"
        ) from None
