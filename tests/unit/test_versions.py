import pytest
from moe_patch import versions
from moe_patch.errors import UsageError

RELEASES = ["0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.9.2", "0.10.0"]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("0.20", "0.20.2"),
        ("v0.20", "0.20.2"),
        ("0.20.1", "0.20.1"),
        ("v0.21.0", "0.21.0"),
        ("0.9", "0.9.2"),
        ("0.10", "0.10.0"),
    ],
)
def test_resolve(spec, expected):
    assert versions.resolve(spec, RELEASES) == expected


def test_unknown_version_names_the_nearest_releases():
    with pytest.raises(UsageError) as err:
        versions.resolve("0.19.7", RELEASES, "INDEX")
    assert str(err.value) == (
        "unknown vLLM version 0.19.7: not among the releases on INDEX; "
        "nearest releases: 0.19.0, 0.19.1, 0.20.0, 0.20.1"
    )
    assert "\n" not in str(err.value)


def test_unknown_minor_series():
    with pytest.raises(UsageError, match="nearest releases: 0.20.2, 0.21.0$"):
        versions.resolve("0.22", RELEASES)


@pytest.mark.parametrize("spec", ["banana", "0.21.0+local", "", "1!0.21"])
def test_not_a_version(spec):
    with pytest.raises(UsageError, match="is not a vLLM"):
        versions.resolve(spec, RELEASES)


def test_is_exact():
    assert versions.is_exact("0.21.0") and versions.is_exact("v0.21.0")
    assert not versions.is_exact("0.21")
