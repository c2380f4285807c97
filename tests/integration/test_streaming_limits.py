"""Limits that hold while a download streams, against a local index that misbehaves: a
deadline a trickling or silent server cannot stretch, a file that stops as soon as it passes
the size its listing states, a listing read no further than its limit, and index credentials
kept off the disk."""

from __future__ import annotations

import base64
import time
import tracemalloc

import pytest
from click.testing import CliRunner
from moe_patch import index
from moe_patch.cli import main

MIB = 1 << 20


def _apply(tmp_path):
    return CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t")])


def _timed(tmp_path):
    started = time.monotonic()
    result = _apply(tmp_path)
    return result, time.monotonic() - started


def _peak(run):
    """``run()`` and the most memory Python held meanwhile."""
    tracemalloc.start()
    try:
        result = run()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("slow", "words"),
    [
        ({"delay": 0.5, "piece": 10}, "download of vllm-1.0.0.tar.gz took longer than 3 s"),
        ({"stall": 30.0}, "download of vllm-1.0.0.tar.gz took longer than 3 s"),
        ({"listing_delay": 0.5, "piece": 10}, "took longer than 3 s to send the vllm listing"),
    ],
    ids=["trickling file", "silent file", "trickling listing"],
)
def test_a_slow_server_stops_at_the_deadline(
    fake_index, series_root, tmp_path, monkeypatch, slow, words
):
    """10 bytes every 0.5 s (or nothing at all) must end at MOE_PATCH_DOWNLOAD_DEADLINE, not
    when the last byte arrives or a 60 s read timeout passes."""
    fake_index.add("1.0.0")
    for key, value in slow.items():
        setattr(fake_index, key, value)
    monkeypatch.setenv("MOE_PATCH_DOWNLOAD_DEADLINE", "3")
    result, seconds = _timed(tmp_path)
    assert result.exit_code == 4, result.output
    assert words in result.stderr and "Traceback" not in result.output
    assert seconds < 3 + 1.5, seconds
    assert not (tmp_path / "t").exists()
    assert not list((tmp_path / "cache").rglob("*.part-*"))


def test_a_body_larger_than_its_listed_size_stops_as_soon_as_it_passes(
    fake_index, series_root, tmp_path
):
    fake_index.add("1.0.0")
    fake_index.listed_size["vllm-1.0.0.tar.gz"] = 1000
    fake_index.endless = True  # no Content-Length: only the listing says how big it is
    result, peak = _peak(lambda: _apply(tmp_path))
    assert result.exit_code == 5, result.output
    assert "sends more than the 1000 bytes the index lists for vllm-1.0.0.tar.gz" in result.stderr
    assert peak < 16 * MIB, peak
    assert fake_index.sent["/files/vllm-1.0.0.tar.gz"] < 64 * MIB  # what socket buffers hold


def test_a_listing_larger_than_its_limit_is_not_read_to_the_end(fake_index, tmp_path, monkeypatch):
    """A 300 MB listing (no Content-Length) is refused after LISTING_LIMIT bytes, without
    ever holding more than that."""
    fake_index.add("1.0.0")
    fake_index.listing_padding = 300 * MIB
    monkeypatch.setattr(index, "LISTING_LIMIT", 4 * MIB)
    result, peak = _peak(lambda: _apply(tmp_path))
    assert result.exit_code == 4, result.output
    assert "sends a vllm listing larger than 4 MiB" in result.stderr
    assert peak < 16 * MIB, peak
    assert fake_index.sent["/simple/vllm/"] < 64 * MIB


@pytest.mark.parametrize(
    ("credentials", "secret", "header"),
    [("alice:hunter2@", "hunter2", "alice:hunter2"), ("s3cr3t-t0k3n@", "s3cr3t-t0k3n", None)],
    ids=["user and password", "token"],
)
def test_index_credentials_are_used_but_never_written_to_the_cache(
    fake_index, series_root, cache_dir, tmp_path, monkeypatch, credentials, secret, header
):
    fake_index.add("1.0.0")
    url = fake_index.url.replace("http://", f"http://{credentials}")
    monkeypatch.setenv("PIP_INDEX_URL", url)
    result = _apply(tmp_path)
    assert result.exit_code == 0, result.output
    for path in cache_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ""):
            assert secret.encode() not in path.read_bytes(), path
    expected = base64.b64encode((header or f"{secret}:").encode()).decode()
    assert fake_index.authorizations["/files/vllm-1.0.0.tar.gz"] == f"Basic {expected}"
    assert secret not in result.output
