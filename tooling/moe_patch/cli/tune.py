"""``moe-patch tune``: FP8 fused-MoE config tables for your model, tuned on your GPU."""

from __future__ import annotations

from pathlib import Path

import click

from ..commands.tune import release_tree, tune
from ..errors import EXIT_LOCAL_IO, EXIT_NETWORK, EXIT_USAGE, command_epilog
from .options import index_option, pass_settings
from .render import render_tune

_release_tree = release_tree  # the name tests/kernels/test_model_tune.py imports

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
    tuned = tune(
        model=model,
        tree=tree,
        out=out,
        tp=tp,
        quant=quant,
        token_counts=token_counts,
        routings=routings,
        seed=seed,
        release=release,
        settings=settings,
        on_discard=_say_discarded(out),
    )
    click.echo(render_tune(tuned))
