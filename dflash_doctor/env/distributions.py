"""Installed distributions read straight from their `.dist-info` folders (no imports, no importlib).

We read METADATA headers, RECORD (file -> sha256, size), WHEEL (tag, build) and INSTALLER, because
those are what tell "the same version" builds apart and which package owns which file. With a
`ParseCache` (what `Environment.load` uses) the parsed headers and RECORD rows are reused across runs
while the files' stat signatures are unchanged (see dflash_doctor/env/parse_cache.py).
"""

from __future__ import annotations

import base64
import csv
import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

from packaging.utils import canonicalize_name

from dflash_doctor.env.parse_cache import Stamp, absorb, stamp_of

if TYPE_CHECKING:
    from packaging.requirements import Requirement

    from dflash_doctor.env.parse_cache import ParseCache


class RecordEntry(NamedTuple):
    """One RECORD row. ``sha256`` is hex (RECORD stores urlsafe base64); ``path`` is absolute."""

    path: str
    sha256: str | None
    size: int | None


RecordRow = tuple[str, "str | None", "int | None"]  # a RecordEntry as plain data (what the cache stores)

# A Requires-Dist line whose whole marker is `extra == "name"` (no URL, one `;`): false without that extra.
_EXTRA_ONLY = re.compile(r"""^[^;@]*;\s*extra\s*==\s*(?:"[^"]+"|'[^']+')\s*$""")


@dataclass
class Distribution:
    """One installed distribution, as its dist-info folder describes it."""

    name: str
    version: str
    dist_info: str
    site_dir: str
    requires: list[str] = field(default_factory=list)
    wheel_tags: list[str] = field(default_factory=list)
    wheel_build: str | None = None
    installer: str | None = None
    direct_url: dict[str, object] | None = None
    parse_cache: ParseCache | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> str:
        """Normalised name (PEP 503): `nvidia_nccl_cu13` and `nvidia-nccl-cu13` are one key."""
        return canonicalize_name(self.name)

    @property
    def managed_by(self) -> str | None:
        """Who owns this install when it is not pip or uv: the INSTALLER named (`debian`, `conda`), or
        `dist-packages` for a package without INSTALLER in a Debian-family system tree (pip's own
        installs there, under /usr/local, say `pip`). Such a package is patched on purpose and is never
        fixed with a `pip install` into the system's Python. None for a pip/uv install."""
        installer = (self.installer or "").strip().lower()
        if installer:
            return None if installer.startswith(("pip", "uv")) else installer
        return "dist-packages" if os.path.basename(self.site_dir) == "dist-packages" else None

    @cached_property
    def record_stamp(self) -> Stamp | None:
        """RECORD's stat signature when its rows were read (None: no RECORD): what the rows are valid for."""
        return stamp_of(os.path.join(self.dist_info, "RECORD"))

    @cached_property
    def record_rows(self) -> list[RecordRow]:
        """RECORD rows as plain (path, sha256, size) tuples, read on first use (torch's has ~20k rows);
        from the parse cache while RECORD is unchanged. The hot loops read these, not `record`."""
        path = os.path.join(self.dist_info, "RECORD")
        if self.parse_cache is None:
            return read_record_rows(path, self.site_dir)
        return self.parse_cache.get(
            "records", path, self.record_stamp, lambda: read_record_rows(path, self.site_dir)
        )

    @cached_property
    def record(self) -> list[RecordEntry]:
        """RECORD rows as RecordEntry (named fields)."""
        return list(map(RecordEntry._make, self.record_rows))

    @cached_property
    def requirements(self) -> list[Requirement]:
        """Every parseable Requires-Dist line (an invalid one is skipped)."""
        return [req for index in range(len(self.requires)) if (req := self._requirement(index)) is not None]

    def numbered_requirements(self, maybe_in_base: bool = False) -> list[tuple[int, Requirement]]:
        """(line number in `requires`, its parse) of every parseable line; with `maybe_in_base`, without the
        lines whose whole marker is `extra == "name"`: those cannot hold for the base install, and are parsed
        only when an extra of this distribution is asked for (fsspec, setuptools, networkx: ~200 such lines in
        a CUDA environment)."""
        return [
            (index, req)
            for index, line in enumerate(self.requires)
            if not (maybe_in_base and _EXTRA_ONLY.match(line))
            and (req := self._requirement(index)) is not None
        ]

    def requirement_line(self, index: int) -> Requirement:
        """Line `index` of Requires-Dist, parsed (once); a line that does not parse is a caller's bug."""
        req = self._requirement(index)
        if req is None:
            raise ValueError(
                f"{self.name}: Requires-Dist line {index} does not parse: {self.requires[index]!r}"
            )
        return req

    def _requirement(self, index: int) -> Requirement | None:
        """Line `index` of Requires-Dist, parsed once (the same object every time it is asked for)."""
        parsed = self._parsed_requirements
        if index not in parsed:
            from packaging.requirements import InvalidRequirement, Requirement

            try:
                parsed[index] = Requirement(self.requires[index])
            except InvalidRequirement:
                parsed[index] = None
        return parsed[index]

    @cached_property
    def _parsed_requirements(self) -> dict[int, Requirement | None]:
        return {}

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "version": self.version,
            "dist_info": self.dist_info,
            "wheel_tags": self.wheel_tags,
            "wheel_build": self.wheel_build,
            "installer": self.installer,
        }


def _hex_from_record_hash(value: str) -> str | None:
    if not value.startswith("sha256="):
        return None
    b64 = value[len("sha256=") :]
    try:
        return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    except ValueError:
        return None


def read_record_rows(record_path: str, site_dir: str) -> list[RecordRow]:
    """RECORD as (absolute normalised path, sha256 hex or None, size or None) tuples; [] if unreadable. The
    hashless `__pycache__/*.pyc` rows pip writes for the bytecode it compiled are left out."""
    try:
        with open(record_path, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except OSError:
        return []
    entries: list[RecordRow] = []
    target = _is_target_folder(site_dir)
    # `site_dir + "/" + rel` is already normal when site_dir is and rel has no empty, "." or ".."
    # component: the checks below say so for nearly every row, without normpath's ~1 us each.
    prefix = site_dir + os.sep if os.sep == "/" and os.path.normpath(site_dir) == site_dir != "/" else None
    for row in rows:
        if not row or not row[0]:
            continue
        rel = row[0]
        if (len(row) < 2 or not row[1]) and rel.endswith(".pyc") and "__pycache__/" in rel:
            continue  # bytecode pip compiled at install: hashless, rewritten at will, never audited (a third of
            # a GPU host's ~74k rows: kept out of the parse cache, which every `check` loads)
        if (
            prefix is not None
            and not rel.startswith(("/", "."))
            and "/." not in rel
            and "//" not in rel
            and not rel.endswith("/")
        ):
            path = prefix + rel
        elif target and rel.startswith("../../"):
            path = os.path.normpath(os.path.join(site_dir, rel[len("../../") :]))
        else:
            path = os.path.normpath(rel if os.path.isabs(rel) else os.path.join(site_dir, rel))
        digest = _hex_from_record_hash(row[1]) if len(row) > 1 and row[1] else None
        size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
        entries.append((path, digest, size))
    return entries


STANDARD_SITE_FOLDERS = ("site-packages", "dist-packages")


def _is_target_folder(site_dir: str) -> bool:
    """A `pip install --target DIR` folder: pip installed into `<tmp>/lib/python` (RECORD rows like
    `../../bin/readelf.py` are relative to that) and then moved `lib/python/*` and the rest of `<tmp>`
    (`bin/`, `share/`) into DIR, so `../../X` lives at `DIR/X`, not two folders above DIR."""
    return os.path.basename(os.path.normpath(site_dir)) not in STANDARD_SITE_FOLDERS


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


DIST_INFO_FILES = ("METADATA", "WHEEL", "INSTALLER", "direct_url.json")

# name, version, Requires-Dist lines, WHEEL tags, WHEEL build, INSTALLER, direct_url.json text
DistFacts = tuple[str, str, tuple[str, ...], tuple[str, ...], "str | None", "str | None", "str | None"]


def read_dist_facts(dist_info: str) -> DistFacts | None:
    """What we need from one `.dist-info` folder, as plain data; None when it has no usable METADATA."""
    meta_text = _read_text(os.path.join(dist_info, "METADATA"))
    if meta_text is None:
        return None
    from email.parser import HeaderParser  # only when a METADATA is really parsed (cache miss)

    headers = HeaderParser().parsestr(meta_text)
    name, version = headers.get("Name"), headers.get("Version")
    if not name or not version:
        return None
    tags: list[str] = []
    build: str | None = None
    wheel = _read_text(os.path.join(dist_info, "WHEEL"))
    if wheel:
        for line in wheel.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Tag":
                tags.append(value.strip())
            elif key.strip() == "Build":
                build = value.strip()
    installer = _read_text(os.path.join(dist_info, "INSTALLER"))
    return (
        name.strip(),
        version.strip(),
        tuple(r.strip() for r in headers.get_all("Requires-Dist") or []),
        tuple(tags),
        build,
        installer.strip() if installer else None,
        _read_text(os.path.join(dist_info, "direct_url.json")),
    )


def _distribution(dist_info: str, facts: DistFacts, cache: ParseCache | None) -> Distribution:
    name, version, requires, tags, build, installer, direct = facts
    direct_url = None
    if direct:
        try:
            direct_url = json.loads(direct)
        except json.JSONDecodeError:
            direct_url = None
    return Distribution(
        name=name,
        version=version,
        dist_info=dist_info,
        site_dir=os.path.dirname(dist_info),
        requires=list(requires),
        wheel_tags=list(tags),
        wheel_build=build,
        installer=installer,
        direct_url=direct_url,
        parse_cache=cache,
    )


def dist_info_stamp(dist_info: str) -> tuple[object, ...]:
    """The parse cache's stamp of a `.dist-info` folder: the stat signatures of the files `read_dist_facts` reads."""
    return tuple(stamp_of(os.path.join(dist_info, name)) for name in DIST_INFO_FILES)


def read_dist_info(dist_info: str, cache: ParseCache | None = None) -> Distribution | None:
    """Parse one `.dist-info` folder (through `cache` when given); None when it has no usable METADATA."""
    if cache is None:
        facts = read_dist_facts(dist_info)
    else:
        facts = cache.get("dists", dist_info, dist_info_stamp(dist_info), lambda: read_dist_facts(dist_info))
    return None if facts is None else _distribution(dist_info, facts, cache)


_DIST_INFO = re.compile(r".+\.dist-info$")
# A first `check` parses the METADATA of ~200 distributions on a GPU host's image: this many a forked process at
# least (`ParseCache.start_prefill`), as RECORDS_PER_PROCESS (a fork ~2 ms; a cold METADATA ~0.5 ms to read and parse).
DISTS_PER_PROCESS = 24


def scan_distributions(
    site_dirs: list[str], cache: ParseCache | None = None
) -> tuple[dict[str, Distribution], list[Distribution]]:
    """Distributions visible on these folders, first folder wins (as importlib.metadata does).

    Returns (visible by key, shadowed): a shadowed distribution is a second copy of the same
    name later on the path (e.g. a `~/.local` torch hiding the venv's, or the reverse).
    """
    folders: list[str] = []  # every `.dist-info`, in the order they shadow one another
    seen_dirs: set[str] = set()
    for site_dir in site_dirs:
        real = os.path.realpath(site_dir)
        if real in seen_dirs:
            continue
        seen_dirs.add(real)
        try:
            names = sorted(os.listdir(site_dir))
        except OSError:
            continue
        folders.extend(os.path.join(site_dir, entry) for entry in names if _DIST_INFO.match(entry))
    if cache is not None:  # a first run: the METADATA files read in a few processes, not one after another
        absorb(
            cache.start_prefill("dists", folders, read_dist_facts, DISTS_PER_PROCESS, stamp=dist_info_stamp)
        )
    visible: dict[str, Distribution] = {}
    shadowed: list[Distribution] = []
    for folder in folders:
        dist = read_dist_info(folder, cache)
        if dist is None:
            continue
        if dist.key in visible:
            shadowed.append(dist)
        else:
            visible[dist.key] = dist
    return visible, shadowed
