"""backend-selector and fp8-moe-backend-env, checked on the real, patched
select_fp8_moe_backend.

The trees, environments and stand-ins are described in conftest.py, venvs.py
and driver.py.  "upstream" is the same release with the rest of the series
but without these two patches, so every difference below is theirs.
"""

from __future__ import annotations

import re

import pytest
from scenarios import (
    CAPABILITIES,
    ENV,
    FP8_SCHEMES,
    automatic,
    env_auto,
    env_choices,
    env_flashinfer,
    env_ignored_upstream,
    env_invalid,
    flag_alone,
    flag_over_env,
    scenario,
)

pytestmark = [pytest.mark.release, pytest.mark.network]

FLASHINFER = pytest.mark.parametrize("flashinfer", [True, False], ids=["fi", "no-fi"])
SELECTION_LINE = re.compile(r"Using (\w+) Fp8 MoE backend out of potential backends: (\[.*?\])")
HOPPER_REASON = (
    "because it is the first supported one; Hopper FP8 MoE without expert "
    f"parallelism tries TRITON first ({ENV}=auto)."
)
UPSTREAM_ORDER_REASON = "because it is the first supported one in vLLM's priority order."


def selection_lines(answer: dict) -> list[str]:
    return [line for line in answer["log"].splitlines() if SELECTION_LINE.search(line)]


def outcome(answer: dict) -> tuple:
    return (answer.get("backend"), answer.get("experts"), answer.get("error"))


def hopper_policy_applies(s: dict) -> bool:
    return s["capability"] == 90 and s["ep"] == "none" and s["scheme"] in FP8_SCHEMES


# -- the new default on Hopper ------------------------------------------------


@FLASHINFER
@pytest.mark.parametrize("allow_vllm_cutlass", [False, True], ids=["no-cutlass", "cutlass"])
@pytest.mark.parametrize("scheme", list(FP8_SCHEMES))
def test_hopper_fp8_without_ep_selects_triton(oracle, flashinfer, allow_vllm_cutlass, scheme):
    s = scenario(scheme, 90, "none", allow_vllm_cutlass)
    answer = oracle.get("patched", flashinfer, s)
    assert outcome(answer) == ("TRITON", "TritonExperts", None), answer
    [line] = selection_lines(answer)
    assert line.endswith(HOPPER_REASON), line
    assert SELECTION_LINE.search(line).group(2).startswith("['TRITON'"), line


@pytest.mark.parametrize(
    "scheme, allow_vllm_cutlass, flashinfer, upstream_backend",
    [
        # the case the selector exists for: per-tensor FP8, static activation scales, FlashInfer
        # installed as vLLM's CUDA requirements install it
        ("tensor-static", False, True, "FLASHINFER_CUTLASS"),
        ("tensor-static", True, True, "FLASHINFER_CUTLASS"),
        # compressed-tensors callers allow vLLM's CUTLASS grouped GEMM
        ("tensor-static", True, False, "VLLM_CUTLASS"),
        ("tensor-dynamic", True, False, "VLLM_CUTLASS"),
        ("channel-token", True, True, "VLLM_CUTLASS"),
    ],
)
def test_upstream_routes_these_hopper_cases_away_from_triton(
    oracle, scheme, allow_vllm_cutlass, flashinfer, upstream_backend
):
    """What the patch changes: upstream's choice for the same deployment."""
    s = scenario(scheme, 90, "none", allow_vllm_cutlass)
    assert oracle.get("upstream", flashinfer, s)["backend"] == upstream_backend
    assert oracle.get("patched", flashinfer, s)["backend"] == "TRITON"


@FLASHINFER
def test_triton_first_but_unsupported_falls_back_to_upstream_choice(oracle, flashinfer):
    """An FP8 pair that Triton's experts refuse keeps upstream's backend."""
    for allow in (False, True):
        s = scenario("tensor-group128", 90, "none", allow)
        patched, upstream = (oracle.get(t, flashinfer, s) for t in ("patched", "upstream"))
        assert outcome(patched) == outcome(upstream), (patched, upstream)
        assert outcome(patched)[0] != "TRITON"


# -- everything else: exactly upstream ----------------------------------------


def strip_reason(line: str) -> str:
    return re.sub(r", because .*\.$", ".", line)


@FLASHINFER
@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm{c}")
def test_other_gpus_quantisations_and_ep_match_upstream(oracle, flashinfer, capability):
    """Same backend, same experts class, same error, same candidate list, and
    the same log line but for the added reason."""
    checked, mismatches = 0, []
    for s in automatic():
        if s["capability"] != capability or hopper_policy_applies(s):
            continue
        if s["capability"] == 90 and s["ep"] == "none" and s["scheme"] == "tensor-group128":
            continue  # Triton moved first, then refused: see the fallback test
        patched, upstream = (oracle.get(t, flashinfer, s) for t in ("patched", "upstream"))
        checked += 1
        if outcome(patched) != outcome(upstream):
            mismatches.append((s["id"], outcome(patched), outcome(upstream)))
            continue
        got, want = selection_lines(patched), selection_lines(upstream)
        if [strip_reason(x) for x in got] != want:
            mismatches.append((s["id"], got, want))
        elif got and not got[0].endswith(UPSTREAM_ORDER_REASON):
            mismatches.append((s["id"], "reason", got))
    assert checked >= 30
    assert not mismatches, "\n".join(map(str, mismatches))


@FLASHINFER
def test_moe_backend_flag_alone_is_upstream_explicit_path(oracle, flashinfer):
    mismatches = []
    for s in flag_alone():
        patched, upstream = (oracle.get(t, flashinfer, s) for t in ("patched", "upstream"))
        if outcome(patched) != outcome(upstream):
            mismatches.append((s["id"], outcome(patched), outcome(upstream)))
        for line in selection_lines(patched):
            if not line.endswith(f"because --moe-backend={s['moe_backend']} requests it."):
                mismatches.append((s["id"], line))
    assert not mismatches, "\n".join(map(str, mismatches))


# -- the environment variable -------------------------------------------------


@FLASHINFER
def test_env_auto_is_the_automatic_choice(oracle, flashinfer):
    for s in env_auto():
        unset = scenario(s["scheme"], s["capability"], s["ep"], s["allow_vllm_cutlass"])
        got, want = (oracle.get("patched", flashinfer, x) for x in (s, unset))
        assert outcome(got) == outcome(want), (s["id"], got, want)
        assert selection_lines(got) == selection_lines(want), s["id"]


@FLASHINFER
@pytest.mark.parametrize("case", env_choices(), ids=lambda c: c[0]["id"])
def test_env_chooses_the_backend(oracle, flashinfer, case):
    s, backend, text = case
    answer = oracle.get("patched", flashinfer, s)
    if backend is None:
        assert text in (answer.get("error") or ""), answer
        return
    assert answer.get("backend") == backend, answer
    [line] = selection_lines(answer)
    assert SELECTION_LINE.search(line).group(1) == backend
    assert text in line, line


def test_env_flashinfer_cutlass_needs_flashinfer(oracle):
    [s] = env_flashinfer()
    present = oracle.get("patched", True, s)
    assert present.get("backend") == "FLASHINFER_CUTLASS", present
    assert f"because {ENV}=flashinfer_cutlass requests it." in present["log"]
    absent = oracle.get("patched", False, s)
    # 0.34.0 on quotes the name: "backend 'FLASHINFER_CUTLASS' does not support".
    error = (absent.get("error") or "").replace("'", "")
    assert "FLASHINFER_CUTLASS does not support" in error, absent


@pytest.mark.parametrize("case", env_invalid(), ids=lambda c: c[0]["id"])
def test_env_invalid_value_fails_listing_valid_ones(oracle, case):
    s, texts = case
    answer = oracle.get("patched", True, s)
    error = answer.get("error") or ""
    assert error.startswith("ValueError"), answer
    for text in texts:
        assert text in error, (text, error)
    assert not selection_lines(answer)


@FLASHINFER
@pytest.mark.parametrize("case", flag_over_env(), ids=lambda c: c[0]["id"])
def test_moe_backend_flag_wins_over_env(oracle, flashinfer, case):
    s, backend, text = case
    answer = oracle.get("patched", flashinfer, s)
    assert answer.get("backend") == backend, answer
    [line] = selection_lines(answer)
    assert line.endswith(f"because {text}."), line


def test_upstream_ignores_the_variable(oracle):
    """The variable is the patch's: upstream's choice does not move with it."""
    s = env_ignored_upstream()
    assert oracle.get("upstream", True, s)["backend"] == "FLASHINFER_CUTLASS"
    assert oracle.get("patched", True, s)["backend"] == "TRITON"
