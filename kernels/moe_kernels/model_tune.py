"""Tune one model's FP8 MoE config table on this GPU, as ``moe-patch tune`` does.

For each token count M, the tree's kernel is timed with the tree's own dispatch
(the config vLLM would launch) and with every :func:`moe_kernels.tune.candidates`
config on the same routings, all taking turns replay by replay, each scored by
both GEMMs' time summed over the routings (:func:`moe_kernels.tune.joint_times`).
The fastest correct candidate is kept only where it beats the dispatch by more than
:data:`moe_kernels.configs.MIN_GAIN` (the search's noise); elsewhere the
dispatch's own config is kept, so no M gets a config slower than the tree's.  With the
unpatched release beside it (``release``), the release's own dispatch (its kernel, its
config) is timed on the same routings too and its config joins the candidates, so no M keeps
a config that the release's config, launched by the tree, beats by more than that noise, nor
one whose first or second GEMM falls behind the release's on a routing where another
candidate keeps pace (:func:`choose`); the report gives the gain over the release.

After each M, two files in the output folder are replaced atomically:

* vLLM's config file for (E, N, this GPU), named by the tree's own
  ``get_config_file_name``: the chosen config at every tuned M, the tree's own
  dispatch at every other M of the grid, and, below and above the grid, the
  entries that make vLLM's nearest-entry lookup launch the tree's dispatch at
  every M (:mod:`moe_kernels.lookup`), so that the file changes nothing where
  nothing was measured;
* :data:`STATE_NAME`, the report: per M the chosen config, its time and the
  dispatch's, the speed-up and the routings.  A run with the same inputs (the
  tree's :func:`moe_kernels.trees.fingerprint` among them) skips the M values it
  already holds; one with other inputs times every M again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from .configs import BLOCK_SHAPE, MIN_GAIN, keeps_pace, vllm_entry
from .decode import fused_decode_tokens
from .dispatch import config_for, device_name, tree_selection
from .loader import load_fused_moe_kernel
from .lookup import own_beyond_the_search
from .measure import (
    DEVICE,
    Shape,
    Variant,
    checkout_commit,
    environment,
    make_weights,
    write_atomically,
)
from .measure import dispatch_config as launch_config
from .trees import fingerprint
from .tune import (
    GEMMS,
    candidates,
    draw_routings,
    joint_times,
    routings_for,
    with_peer_configs,
)

STATE_NAME = "moe-patch-tune.json"
DTYPE = "fp8_w8a8"


def block_shape(quant: str) -> list[int] | None:
    return BLOCK_SHAPE if quant == "block" else None


def config_file_name(tree: Path, shape: Shape, quant: str) -> str:
    """The file vLLM looks up for this shape on this GPU, in the tree's own words."""
    ns = tree_selection(str(tree), device_name(), None)
    return ns["get_config_file_name"](shape.experts, shape.intermediate, DTYPE, block_shape(quant))


def shipped_token_counts(tree: Path, shape: Shape, quant: str) -> list[int]:
    """The token counts of the config file the tree ships for this shape on this GPU."""
    ns = tree_selection(str(tree), device_name(), None)
    block_n, block_k = block_shape(quant) or (0, 0)
    return sorted(
        ns["get_moe_configs"](shape.experts, shape.intermediate, DTYPE, block_n, block_k) or ()
    )


def dispatch_config(tree: Path, shape: Shape, quant: str, M: int) -> dict:
    """The config the tree launches at M without a tuned folder (its table, else default)."""
    config, _ = config_for(
        tree, M, shape.experts, shape.intermediate, shape.hidden, shape.topk, DTYPE,
        block_shape(quant),
    )  # fmt: skip
    return config


def earlier_results(out: Path, inputs: dict) -> tuple[dict, list[str]]:
    """The per-M results of an earlier run in ``out`` with the same ``inputs`` (M as a
    string key), and the inputs that differ where an earlier run had others (its results
    are then not kept)."""
    path = out / STATE_NAME
    if not path.is_file():
        return {}, []
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}, ["the earlier report (unreadable)"]
    before = state.get("inputs") or {}
    differ = sorted(
        key for key in inputs.keys() | before.keys() if before.get(key) != inputs.get(key)
    )
    return ({}, differ) if differ else (state.get("results", {}), [])


TIMED_KEYS = ("config", "config_source", "us", "up_us", "down_us")


def choose(own: dict, released: dict | None, good: list[dict]) -> tuple[dict, bool]:
    """The timing to keep at one M, and whether it is a candidate rather than the dispatch.

    A candidate replaces the dispatch where it is faster by more than ``MIN_GAIN``. With the
    release timed (and correct), only candidates that keep pace with it count (neither GEMM
    slower than :data:`moe_kernels.configs.PEER_FLOOR` times the release's on any routing:
    the two GEMMs share one config, and a faster pair can hide a GEMM that lost), and a
    dispatch that does not keep pace is replaced by the fastest that does, even a slower
    pair; where none does, the fastest pair is judged as before."""
    pace = [released] if released is not None and released["correct"] else []
    keeping = [t for t in good if keeps_pace(t, pace)]
    fastest = min(keeping or good, key=lambda t: t["us"], default=None)
    if fastest is None:
        return own, False
    own_lags = bool(keeping) and not keeps_pace(own, pace)
    if not own["correct"] or own_lags or fastest["us"] < (1 - MIN_GAIN) * own["us"]:
        return fastest, True
    return own, False


def tune_one_m(
    variant, shape, quant, M, weights, routings, seed, candidates_for, release=None
) -> dict:
    """Time the dispatch and every candidate at M on the same routings; the chosen row.
    With ``release`` (the unpatched release's Variant) its own dispatch, its kernel and
    its config, is timed with them, and its config joins the candidates on the tree's
    kernel, so the chosen config is never one that the release's config beats there by
    more than the search's noise."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed * 100_003 + M)
    draws, hit = draw_routings(shape, quant, M, routings, gen)
    pool = candidates_for(quant, M, shape)
    peers = [] if release is None else [release]
    if release is not None:
        case = draws[0][0]["up"]
        pool = with_peer_configs(
            pool,
            [{"config": launch_config(release, case)[0]}],
            {"config": launch_config(variant, case)[0]},
        )
    own, *rest = joint_times(
        [(variant, None)] + [(p, None) for p in peers] + [(variant, c) for c in pool],
        draws,
        weights,
    )
    released, tried = (rest[0] if peers else None), rest[len(peers) :]
    good = [t for t in tried if t is not None and t["correct"]]
    chosen, tuned = choose(own, released, good)
    return {
        "M": M,
        "experts_hit": hit,
        "chosen": "tuned" if tuned else "dispatch",
        "config": vllm_entry(chosen["config"]),
        "us": chosen["us"],
        "dispatch": {key: own[key] for key in TIMED_KEYS},
        "dispatch_correct": own["correct"],
        "speedup": own["us"] / chosen["us"],
        **(
            {
                "release": {key: released[key] for key in TIMED_KEYS},
                "release_correct": released["correct"],
                "speedup_over_release": released["us"] / chosen["us"],
            }
            if released is not None
            else {}
        ),
        "candidates": len(tried),
        "rejected": len(tried) - len(good),  # did not compile, or computed wrongly
    }


@functools.cache
def own_choice(tree: Path, shape: Shape, quant: str) -> Callable[[int], dict]:
    """M -> the tree's dispatch at M as a table entry (cached: the lookup fill asks for
    every M outside the tuned range, and the table is written after each M)."""
    return functools.cache(lambda M: vllm_entry(dispatch_config(tree, shape, quant, M)))


def config_table(tree: Path, shape: Shape, quant: str, Ms: Iterable[int], rows: dict) -> dict:
    """vLLM's table: each tuned row's config, the tree's dispatch at every other M of the
    grid, and, outside the grid's range, the entries that make vLLM's nearest-entry lookup
    launch the tree's dispatch at every M."""
    own = own_choice(Path(tree), shape, quant)
    Ms = sorted(set(Ms))
    # The tree's own file, where it ships one, serves outside the grid as it stands.
    table = {str(M): own(M) for M in shipped_token_counts(tree, shape, quant)}
    table = {k: v for k, v in table.items() if not Ms[0] <= int(k) <= Ms[-1]}
    table |= {str(M): rows[str(M)]["config"] if str(M) in rows else own(M) for M in Ms}
    return own_beyond_the_search(table, Ms, own)


def tune_model(
    tree: Path,
    shape: Shape,
    quant: str,
    Ms: Iterable[int],
    out: Path,
    *,
    routings: int | str = "auto",
    seed: int = 0,
    candidates_for: Callable[[str, int, Shape], list[dict]] = candidates,
    on_result: Callable[[dict], None] | None = None,
    on_discard: Callable[[list[str]], None] | None = None,
    release: Path | None = None,
    series_version: str | None = None,
    static_activations: bool = False,
) -> dict:
    """Tune ``shape`` at every M of ``Ms`` on ``tree``'s kernel; write the config file and
    the report into ``out`` after each M and return the report.  With ``release`` (the
    vLLM tree the series was applied to, unpatched) each M also times the release's own
    dispatch on the same routings and tries its config (:func:`tune_one_m`).  ``routings``
    per M: a number, or "auto" (:func:`moe_kernels.tune.routings_for`: six where the experts a
    batch hits vary much, two elsewhere); the report
    gives the gain over it.  ``on_result`` is called with each M's row, tuned now or
    kept from an earlier run; ``on_discard`` with the inputs that differ when ``out`` holds an earlier run with other inputs (a tree whose
    fused-MoE folder changed, another seed ...), whose results are then timed again.
    ``series_version``: the version of the series ``tree`` carries, as its caller knows it
    (``moe-patch tune`` passes its own), recorded among the inputs.  The report's
    ``fused_decode_tokens``: the largest batch that the tree's fused decode rule takes away
    from ``fused_moe_kernel`` on Hopper for this layer (``static_activations``: the model's
    activation scales are calibrated; 0: never), whose configs serve only without it."""
    Ms = sorted(set(Ms))
    out.mkdir(parents=True, exist_ok=True)
    name = config_file_name(tree, shape, quant)
    inputs = {
        "tree": str(Path(tree).resolve()),
        "tree_fingerprint": fingerprint(Path(tree)),
        "shape": dataclasses.asdict(shape),
        "quant": quant,
        "routings": routings,
        "seed": seed,
        "device": device_name(),
        "series_version": series_version,
        **({"release_fingerprint": fingerprint(Path(release))} if release is not None else {}),
    }
    rows, differ = earlier_results(out, inputs)
    if differ and on_discard is not None:
        on_discard(differ)
    report = {
        "inputs": inputs,
        "series_commit": checkout_commit(),  # not an input: a new commit keeps the results
        "environment": environment(),
        "config_file": name,
        "fused_decode_tokens": fused_decode_tokens(
            tree, (shape.hidden, shape.intermediate), quant == "block", static_activations
        ),
        "results": rows,
    }
    variant = Variant("tree", Path(tree), load_fused_moe_kernel(Path(tree)))
    released = None
    if release is not None:
        released = Variant("release", Path(release), load_fused_moe_kernel(Path(release)))

    def save() -> None:
        report["results"] = dict(sorted(rows.items(), key=lambda kv: int(kv[0])))
        table = config_table(tree, shape, quant, Ms, rows)
        write_atomically(out / name, json.dumps(table, indent=4) + "\n")
        write_atomically(out / STATE_NAME, json.dumps(report, indent=1) + "\n")

    weights = None
    for M in Ms:
        if str(M) not in rows:
            if weights is None:  # drawn once, and only when some M is left to time
                gen = torch.Generator(device=DEVICE).manual_seed(seed)
                weights = {g: make_weights(shape, g, quant, gen) for g in GEMMS}
            draws = routings_for(shape, M) if routings == "auto" else routings
            rows[str(M)] = tune_one_m(
                variant, shape, quant, M, weights, draws, seed, candidates_for, released
            )
            save()
        if on_result is not None:
            on_result(rows[str(M)])
    save()  # the table also covers this run's M grid where an earlier run's did not
    return report
