import socket

import pytest
from moe_patch import index, pipconfig
from moe_patch.errors import NetworkError
from moe_patch.pipconfig import IndexSettings


def test_index_url_precedence(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://env.invalid/simple/")
    assert (
        pipconfig.index_settings("http://flag.invalid/simple").url == "http://flag.invalid/simple"
    )
    assert pipconfig.index_settings().url == "http://env.invalid/simple"


def test_default_index_is_pips_own(monkeypatch):
    from pip._internal.models.index import PyPI

    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.setattr(pipconfig, "_pip_config", dict)
    pipconfig._configured.cache_clear()
    try:
        assert pipconfig.index_settings().url == PyPI.simple_url.rstrip("/")
    finally:
        pipconfig._configured.cache_clear()


def test_pip_config_file_is_honoured(monkeypatch):
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.setattr(
        pipconfig,
        "_pip_config",
        lambda: {
            "global.index-url": "http://global.invalid/simple",
            "install.index-url": "http://install.invalid/simple",
        },
    )
    pipconfig._configured.cache_clear()
    try:
        assert pipconfig.index_settings().url == "http://install.invalid/simple"
    finally:
        pipconfig._configured.cache_clear()


def test_json_listing_skips_yanked_and_prereleases(fake_index):
    fake_index.add("0.20.0")
    fake_index.add("0.21.0")
    fake_index.archives["vllm-0.22.0rc1.tar.gz"] = b"x"
    dists = index.distributions(IndexSettings(fake_index.url))
    assert [d.version for d in dists] == ["0.20.0", "0.21.0"]
    assert all(len(d.sha256) == 64 and d.url.endswith(d.filename) for d in dists)


def test_html_listing(fake_index):
    fake_index.add("0.20.0")
    fake_index.mode = "html"
    (dist,) = index.distributions(IndexSettings(fake_index.url))
    assert dist.version == "0.20.0" and dist.sha256 and dist.url.startswith("http://127.0.0.1")


def test_garbage_listing_is_a_one_line_error(fake_index):
    fake_index.mode = "garbage"
    with pytest.raises(NetworkError, match="not a valid PEP 691 listing") as err:
        index.distributions(IndexSettings(fake_index.url))
    assert "\n" not in str(err.value)


def test_http_error(fake_index):
    fake_index.mode = "error"
    with pytest.raises(NetworkError, match="answered HTTP 503"):
        index.distributions(IndexSettings(fake_index.url))


def test_unreachable_index(cache_dir):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    with pytest.raises(NetworkError, match="cannot reach the package index"):
        index.distributions(IndexSettings(f"http://127.0.0.1:{port}/simple"))


def test_stale_listing_is_used_when_the_index_is_down(fake_index, monkeypatch, capsys):
    fake_index.add("0.20.0")
    settings = IndexSettings(fake_index.url)
    index.distributions(settings)
    fake_index.mode = "error"
    monkeypatch.setattr(index, "LISTING_TTL", 0)
    assert [d.version for d in index.distributions(settings)] == ["0.20.0"]
    assert "using the release list cached" in capsys.readouterr().err


def test_fresh_listing_needs_no_request(fake_index):
    fake_index.add("0.20.0")
    settings = IndexSettings(fake_index.url)
    index.distributions(settings)
    index.distributions(settings)
    assert fake_index.requests.count("/simple/vllm/") == 1
