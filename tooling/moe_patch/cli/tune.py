"""``moe-patch tune``: FP8 fused-MoE config tables for your model, tuned on your GPU."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from .. import __version__
from ..errors import (
    EXIT_LOCAL_IO,
    EXIT_NETWORK,
    EXIT_USAGE,
    NetworkError,
    UsageError,
    command_epilog,
)
from ..model_config import moe_shape
from ..ui import progress
from .options import index_option, pass_settings

KERNELS_MISSING = "moe-patch tune needs torch and triton: pip install 'moe-patch[kernels]'"

# The report's inputs, as a user would name what changed since an earlier run.
INPUT_WORDS = {
    "tree": "tree path",
    "tree_fingerprint": "tree content (its fused-MoE folder changed)",
    "shape": "model shape or --tp",
    "quant": "--quant",
    "routings": "--routings",
    "seed": "--seed",
    "device": "GPU",
    "series_version": "moe-patch version",
    "release_fingerprint": "--release tree",
}


def _release_tree(
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


def _print_gains(report: dict, token_counts: list[int]) -> None:
    """Per M: the release's time (where it was timed), the tree's dispatch, the tuned config,
    and the tuned config's gain over each."""
    rows = [report["results"][str(M)] for M in token_counts]
    against_release = all("release" in row for row in rows)
    columns = ["release µs"] if against_release else []
    columns += ["dispatch µs", "tuned µs"]
    columns += ["vs dispatch", "vs release"] if against_release else ["speed-up"]
    click.echo("  ".join([f"{'M':>5}", *(f"{c:>11}" for c in columns)]))
    for M, row in zip(token_counts, rows, strict=True):
        cells = [row["release"]["us"]] if against_release else []
        cells = [f"{us:.1f}" for us in [*cells, row["dispatch"]["us"], row["us"]]]
        cells.append(f"{row['speedup']:.2f}x")
        if against_release:
            cells.append(f"{row['speedup_over_release']:.2f}x")
        click.echo("  ".join([f"{M:>5}", *(f"{c:>11}" for c in cells)]))


def _say_discarded(out: Path):
    def say(differ: list[str]) -> None:
        what = ", ".join(INPUT_WORDS.get(key, key) for key in differ)
        click.echo(f"{out}: the earlier run there had another {what}; tuning every M again")

    return say


def _token_counts(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None  # vLLM's grid, moe_kernels.measure.VLLM_GRID
    try:
        counts = sorted({int(m) for m in value.split(",") if m.strip()})
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not counts or counts[0] < 1:
        raise click.BadParameter(f"{value!r}: token counts are 1 or more")
    return counts


def _routings(ctx, param, value: str) -> int | str:
    if value == "auto":
        return value
    try:
        count = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither auto nor a number of routings") from None
    if count < 1:
        raise click.BadParameter(f"{value!r}: at least one routing")
    return count


@click.command(
    "tune",
    epilog=command_epilog(
        [
            "moe-patch tune --model ./Qwen3-30B-A3B-FP8 --tp 2 --tree ./vllm --out tuned/",
            "moe-patch tune --model config.json --tp 8 --tree ./vllm --M 1,2,4,8 --out tuned/",
        ],
        {EXIT_USAGE, EXIT_NETWORK, EXIT_LOCAL_IO},
    ),
)
@click.option(
    "--model",
    required=True,
    type=click.Path(path_type=Path),
    help="The model's Hugging Face config.json, or the folder holding it.",
)
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size.")
@click.option(
    "--tree",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The patched vLLM source tree whose kernel and own dispatch are timed "
    "(moe-patch apply, or moe-patch checkout).",
)
@click.option(
    "--quant",
    type=click.Choice(["tensor", "block"]),
    help="FP8 scales [default: block where config.json's quantization_config has "
    "weight_block_size, else tensor].",
)
@click.option(
    "--M",
    "token_counts",
    metavar="M,M,...",
    callback=_token_counts,
    help="Token counts to tune [default: vLLM's grid: every M in 1..16 and every CUDA-graph "
    "capture size vLLM pads a decode batch to, up to 512: multiples of 8 to 256, of 16 beyond].",
)
@click.option(
    "--routings",
    metavar="auto|N",
    default="auto",
    show_default=True,
    callback=_routings,
    help="Routings drawn per M; configs are scored on their sum and compared with the "
    "release on each. auto: six where the number of experts a batch hits varies by more "
    "than 8% (few experts, small top-k, few tokens), else two.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of weights and routings."
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for vLLM's config file and the report (moe-patch-tune.json).",
)
@click.option(
    "--release",
    default="auto",
    show_default=True,
    metavar="auto|none|PATH",
    help="The unpatched vLLM each M is also timed with (its own kernel and config, on the "
    "same routings; its config is tried too) and the gain is reported against: auto, the "
    "release --tree says it is, through moe-patch's download cache; a vLLM source tree; "
    "or none.",
)
@index_option
@pass_settings
def command(model, tp, tree, quant, token_counts, routings, seed, out, release, settings):
    """Tune FP8 fused-MoE configs for a model on this GPU, in vLLM's config-file format.

    From the model's config.json (experts, top-k, hidden and MoE intermediate size) and
    the tensor-parallel size, each M is timed with the tree's own dispatch and with the
    candidate configs on the same routings (both GEMMs); a candidate is kept only where
    it beats the dispatch.  After each M, vLLM's config file and moe-patch-tune.json
    (the report) are written to --out; run the same command again to resume.  Point vLLM
    at the folder with VLLM_TUNED_CONFIG_FOLDER.
    """
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
        release_tree = _release_tree(release, tree, Path(scratch), settings.index_url)
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
                    on_discard=_say_discarded(out),
                    release=release_tree,
                    series_version=__version__,
                )
            except KernelLoadError as exc:
                raise UsageError(f"cannot load fused_moe_kernel: {exc}") from None
    _print_gains(report, token_counts)
    click.echo(f"wrote {out / report['config_file']}")
    click.echo(f"export VLLM_TUNED_CONFIG_FOLDER={out.resolve()}")
