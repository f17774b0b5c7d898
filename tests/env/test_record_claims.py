"""The paths several audited RECORD rows claim (twins; a RECORD repeating a row), kept in the parse cache: read
back they are what a walk of every row finds, and a RECORD rewritten since, or an entry that does not fit the
rows, means a new walk."""

from __future__ import annotations

import pytest

from dflash_doctor.env import parse_cache
from dflash_doctor.env.parse_cache import ParseCache
from dflash_doctor.env.record_audit import SEVERAL_KEY, RecordRows, several_claims
from tests.conftest import env_for
from tests.fakeenv import FakeSite


@pytest.fixture(autouse=True)
def not_racy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixture's RECORDs are seconds old: let the cache keep what is derived from them."""
    monkeypatch.setattr(parse_cache, "RACY_SECONDS", 0.0)


def twins(site: FakeSite) -> FakeSite:
    site.add_dist("nvidia-nccl-cu12", "2.21.5", {"nvidia/nccl/lib/libnccl.so.2": b"a" * 40, "a.py": b""})
    site.add_dist("nvidia-nccl-cu13", "2.28.9", {"nvidia/nccl/lib/libnccl.so.2": b"b" * 40})
    site.add_dist("pkg", "1.0", {"pkg/m.py": b"m", "pkg/n.py": b"n"})
    record = next(site.root.glob("pkg-*.dist-info")) / "RECORD"
    record.write_text(record.read_text() + record.read_text().splitlines()[0] + "\n")  # one row listed twice
    return site


def claims(site: FakeSite, cache: ParseCache | None) -> dict[str, list[tuple[str, tuple[object, ...]]]]:
    dists = env_for(site).distributions
    found = several_claims(dists, RecordRows.of(dists), cache)
    return {path.split("/site-packages/")[-1]: sorted(owners) for path, owners in found.items()}


def test_claims_read_back_are_the_walked_ones(site: FakeSite) -> None:
    twins(site)
    cache = ParseCache(None)
    walked = claims(site, None)
    assert set(walked) == {"nvidia/nccl/lib/libnccl.so.2", "pkg/m.py"}
    assert [key for key, _ in walked["pkg/m.py"]] == ["pkg", "pkg"]
    assert claims(site, cache) == walked and cache.misses == 1
    assert claims(site, cache) == walked and cache.hits == 1  # a later run: nothing walked


def test_a_rewritten_record_means_a_new_walk(site: FakeSite) -> None:
    twins(site)
    cache = ParseCache(None)
    claims(site, cache)
    site.add_dist("nccl-twin", "1.0", {"a.py": b""})  # installed since: claims a.py too
    found = claims(site, cache)
    assert cache.misses == 2 and sorted(key for key, _ in found["a.py"]) == ["nccl-twin", "nvidia-nccl-cu12"]


def test_an_entry_that_does_not_fit_is_walked_again(site: FakeSite) -> None:
    twins(site)
    cache = ParseCache(None)
    walked = claims(site, cache)
    stamp = cache.tables["derived"][SEVERAL_KEY][0]
    for stored in (
        [(str(site.root / "pkg/m.py"), [("pkg", 999)])],  # no such row
        [(str(site.root / "pkg/m.py"), [("gone", 0)])],  # no such distribution
        [("/elsewhere/m.py", [("pkg", 0), ("pkg", 0)])],  # the row lists another path
        "not claims",
    ):
        cache.tables["derived"][SEVERAL_KEY] = (stamp, stored)
        assert claims(site, cache) == walked
