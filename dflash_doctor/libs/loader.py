"""A pure simulation of one process loading torch, following glibc's search rules.

For a NEEDED soname (or a `dlopen` without a slash) glibc looks, in order:
  1. already loaded: an object with that soname satisfies the lookup ("loaded");
  2. DT_RPATH of the requesting object and then of the objects that loaded it, but only when the
     requesting object has no DT_RUNPATH; then the executable's DT_RPATH ("rpath");
  3. `LD_LIBRARY_PATH` ("ld_library_path");
  4. DT_RUNPATH of the requesting object only ("runpath");
  5. `/etc/ld.so.cache` ("ld.so.cache"), then the default folders ("default").
Dependencies are mapped breadth-first and the first file loaded for a soname wins for the whole
process. `import torch` first dlopens `libtorch_global_deps.so` and the CUDA libraries of
`_preload_cuda_deps` by full path ("preload"), then `torch/_C*.so`. Libraries torch dlopens later
(`libtorch_cuda_linalg.so`, `libcaffe2_nvrtc.so`) and other extension libraries that need CUDA
libraries are resolved afterwards, in the process torch has already populated.

Nothing here imports torch. `hidden` is a what-if: files it accepts are treated as absent
(`dflash-doctor why` uses it to say what happens without a package).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

from dflash_doctor.context import CheckContext
from dflash_doctor.env.elf import ElfInfo, read_elf
from dflash_doctor.env.environment import Environment
from dflash_doctor.libs.ldcache import LdCache, load_system_cache
from dflash_doctor.libs.preload import PreloadPlan, read_preload_plan
from dflash_doctor.libs.sonames import is_cuda_soname, is_driver_soname

VIAS = ("preload", "loaded", "rpath", "ld_library_path", "runpath", "ld.so.cache", "default", "missing")
STAGES = ("import", "lazy", "extension")
PRELOAD_REQUESTER = "torch/__init__.py"
_SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")


@dataclass(frozen=True)
class Resolution:
    """One lookup: `requester` asked for `soname` and got `path` (None: not found) by `via`.

    ``owners``: distributions whose RECORD lists the file. ``searched``: folders tried, in order
    (evidence for a miss). ``stage``: "import" (during `import torch`), "lazy" (torch dlopens it on
    first use), "extension" (another package's extension library).
    """

    requester: str
    soname: str
    path: str | None
    via: str
    owners: tuple[str, ...] = ()
    searched: tuple[str, ...] = ()
    stage: str = "import"

    @property
    def found(self) -> bool:
        return self.path is not None

    def to_json(self) -> dict[str, object]:
        return {
            "requester": self.requester,
            "soname": self.soname,
            "path": self.path,
            "via": self.via,
            "owners": list(self.owners),
            "stage": self.stage,
        }


@dataclass
class LibraryReport:
    """Every lookup of one simulated `import torch`, and the file each soname ends up as."""

    torch_dir: str | None
    site_dir: str | None
    cuda_major: int | None
    ld_library_path: tuple[str, ...]
    plan: PreloadPlan | None
    resolutions: list[Resolution] = field(default_factory=list)
    by_soname: dict[str, Resolution] = field(default_factory=dict)
    import_error: str | None = None
    extensions: list[str] = field(default_factory=list)

    def missing(self, stages: Iterable[str] = STAGES) -> list[Resolution]:
        """Lookups that found nothing (driver libraries excluded: they come with the GPU driver)."""
        wanted = set(stages)
        return [
            r
            for r in self.resolutions
            if r.via == "missing" and r.stage in wanted and not is_driver_soname(r.soname)
        ]

    def needed_by(self, requester_name: str) -> list[Resolution]:
        """The lookups one object made (`libtorch_cuda.so` or a full path), in NEEDED order."""
        return [
            r
            for r in self.resolutions
            if r.requester == requester_name or os.path.basename(r.requester) == requester_name
        ]

    def effective(self, soname: str) -> Resolution | None:
        """The lookup that loaded this soname into the process (first load wins)."""
        return self.by_soname.get(soname)

    def cuda_sonames_of(self, requester_name: str) -> list[Resolution]:
        """The CUDA sonames one object needs, each as the process really ends up with it."""
        out = []
        for lookup in self.needed_by(requester_name):
            if not is_cuda_soname(lookup.soname):
                continue
            out.append(self.by_soname.get(lookup.soname, lookup) if lookup.via == "loaded" else lookup)
        return out

    def requesters_of(self, soname: str) -> list[str]:
        """Every object that names this soname (NEEDED or preload), in lookup order, no repeats."""
        seen: dict[str, None] = {}
        for r in self.resolutions:
            if r.soname == soname:
                seen.setdefault(r.requester, None)
        return list(seen)

    def inside_torch_tree(self, path: str) -> bool:
        """Whether a file lives in the site-packages folder torch itself was installed into."""
        if self.site_dir is None:
            return False
        return os.path.normpath(path).startswith(self.site_dir.rstrip(os.sep) + os.sep)

    @cached_property
    def loaded_paths(self) -> dict[str, str]:
        """soname -> path for every object loaded (what `/proc/self/maps` should show)."""
        return {s: r.path for s, r in self.by_soname.items() if r.path}

    def to_json(self) -> dict[str, object]:
        return {
            "torch_dir": self.torch_dir,
            "import_error": self.import_error,
            "ld_library_path": list(self.ld_library_path),
            "by_soname": {s: r.to_json() for s, r in sorted(self.by_soname.items())},
            "missing": [r.to_json() for r in self.missing()],
        }


@dataclass
class _Loaded:
    """An object mapped into the simulated process; `loader` is who made it load (for RPATH)."""

    path: str
    info: ElfInfo
    loader: _Loaded | None


class _Process:
    """The mutable state of one simulated process. Use `simulate_import` from outside."""

    def __init__(
        self,
        ld_library_path: tuple[str, ...],
        ldcache: LdCache,
        owners_of: Callable[[str], list[str]],
        hidden: Callable[[str], bool],
        executable_rpath: tuple[str, ...] = (),
        read: Callable[[str], ElfInfo | None] = read_elf,
    ) -> None:
        self.ld_library_path = ld_library_path
        self.ldcache = ldcache
        self.owners_of = owners_of
        self.hidden = hidden
        self.executable_rpath = executable_rpath
        self.by_name: dict[str, _Loaded] = {}
        self.by_real: dict[str, _Loaded] = {}
        self.resolutions: list[Resolution] = []
        self.by_soname: dict[str, Resolution] = {}
        self._elf_cache: dict[str, ElfInfo | None] = {}
        self._read = read
        self._realpaths: dict[str, str] = {}
        self.stage = "import"

    # -- files --------------------------------------------------------------------------------
    def realpath(self, path: str) -> str:
        """`os.path.realpath`, remembered: it lstats every component, and the same few hundred paths recur."""
        real = self._realpaths.get(path)
        if real is None:
            real = self._realpaths[path] = os.path.realpath(path)
        return real

    def present(self, path: str) -> bool:
        return os.path.isfile(path) and not self.hidden(os.path.normpath(path))

    def elf(self, path: str) -> ElfInfo | None:
        if path not in self._elf_cache:
            self._elf_cache[path] = self._read(path)
        return self._elf_cache[path]

    def _usable(self, path: str, like: ElfInfo | None) -> ElfInfo | None:
        """glibc skips a candidate of the wrong class or machine and keeps searching."""
        if not self.present(path):
            return None
        info = self.elf(path)
        if info is None:
            return None
        if like is not None and (info.machine != like.machine or info.elf_class != like.elf_class):
            return None
        return info

    # -- lookups ------------------------------------------------------------------------------
    def search(self, name: str, requester: _Loaded | None) -> tuple[str | None, str, tuple[str, ...]]:
        """glibc's order for a soname without a slash; returns (path, via, folders searched)."""
        like = requester.info if requester else None
        searched: list[str] = []

        def first_in(folders: Iterable[str]) -> str | None:
            for folder in folders:
                searched.append(folder)
                candidate = os.path.join(folder, name)
                if self._usable(candidate, like):
                    return os.path.normpath(candidate)
            return None

        if requester is None or not requester.info.runpath:
            chain: list[str] = []
            obj = requester
            while obj is not None:
                chain.extend(obj.info.rpath)
                obj = obj.loader
            chain.extend(self.executable_rpath)
            if found := first_in(chain):
                return found, "rpath", tuple(searched)
        if found := first_in(self.ld_library_path):
            return found, "ld_library_path", tuple(searched)
        if requester is not None and (found := first_in(requester.info.runpath)):
            return found, "runpath", tuple(searched)
        cached = self.ldcache.lookup(name)
        searched.append(f"ld.so.cache ({self.ldcache.source})")
        if cached and self._usable(cached, like):
            return cached, "ld.so.cache", tuple(searched)
        if found := first_in(self.ldcache.default_dirs):
            return found, "default", tuple(searched)
        return None, "missing", tuple(searched)

    def record(self, requester: str, soname: str, path: str | None, via: str, searched=()) -> Resolution:
        owners = tuple(self.owners_of(path)) if path else ()
        res = Resolution(requester, soname, path, via, owners, tuple(searched), self.stage)
        self.resolutions.append(res)
        if path is not None and via != "loaded":
            self.by_soname.setdefault(soname, res)
        return res

    def _register(self, path: str, info: ElfInfo, loader: _Loaded | None) -> _Loaded:
        obj = _Loaded(path, info, loader)
        self.by_name.setdefault(info.name, obj)
        self.by_name.setdefault(os.path.basename(path), obj)
        self.by_real[self.realpath(path)] = obj
        return obj

    def dlopen_path(self, path: str, requester: str) -> list[Resolution]:
        """dlopen by full path (a preload, Python importing an extension). Returns its misses."""
        path = os.path.normpath(path)
        info = self.elf(path) if self.present(path) else None
        if info is None:
            return [self.record(requester, os.path.basename(path), None, "missing", (os.path.dirname(path),))]
        # By path glibc reuses only the same file; a second file with a loaded soname is mapped
        # again (two copies in one process), while later lookups by soname keep the first.
        known = self.by_real.get(self.realpath(path))
        if known is not None:
            self.record(requester, info.name, known.path, "loaded")
            return []
        with self._undone_on_failure() as misses:
            self.record(requester, info.name, path, "preload")
            misses += self._map_dependencies(self._register(path, info, None))
        return misses

    def dlopen_name(self, name: str, caller: _Loaded | None, requester: str) -> list[Resolution]:
        """dlopen of a bare soname from `caller` (its RPATH applies as for NEEDED)."""
        known = self.by_name.get(name)
        if known is not None:
            self.record(requester, name, known.path, "loaded")
            return []
        path, via, searched = self.search(name, caller)
        with self._undone_on_failure() as misses:
            res = self.record(requester, name, path, via, searched)
            if path is None:
                misses.append(res)
            else:
                info = self.elf(path)
                assert info is not None  # search only returns usable ELF files
                misses += self._map_dependencies(self._register(path, info, caller))
        return misses

    @contextmanager
    def _undone_on_failure(self) -> Iterator[list[Resolution]]:
        """A dlopen that misses a dependency unmaps everything it mapped (glibc rolls it back).

        The lookups stay recorded as evidence; only the process state is restored.
        """
        names, reals, sonames = set(self.by_name), set(self.by_real), set(self.by_soname)
        misses: list[Resolution] = []
        yield misses
        if misses:
            for table, before in ((self.by_name, names), (self.by_real, reals), (self.by_soname, sonames)):
                for key in set(table) - before:
                    del table[key]

    def _map_dependencies(self, root: _Loaded) -> list[Resolution]:
        """Breadth-first over NEEDED, as `_dl_map_object_deps` does; returns the misses."""
        misses: list[Resolution] = []
        queue = deque([root])
        while queue:
            obj = queue.popleft()
            for name in obj.info.needed:
                known = self.by_name.get(name)
                if known is not None:
                    self.record(obj.path, name, known.path, "loaded")
                    continue
                path, via, searched = self.search(name, obj)
                res = self.record(obj.path, name, path, via, searched)
                if path is None:
                    misses.append(res)
                    continue
                same_file = self.by_real.get(self.realpath(path))
                if same_file is not None:  # found under another name: glibc reuses the mapping
                    self.by_name.setdefault(name, same_file)
                    continue
                info = self.elf(path)
                assert info is not None
                queue.append(self._register(path, info, obj))
        return misses

    def find(self, name: str) -> _Loaded | None:
        return self.by_name.get(name)


def _glob_first_in_listing_order(folder: str, pattern: str, hidden: Callable[[str], bool]) -> list[str]:
    """`glob.glob(folder/pattern)` in the directory's own order (what torch's preload gets)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [
        os.path.join(folder, n)
        for n in names
        if not n.startswith(".") and fnmatch.fnmatchcase(n, pattern) and not hidden(os.path.join(folder, n))
    ]


def preload_candidates(
    sys_path: Iterable[str], folder: str, pattern: str, cuda_major: int | None, plan: PreloadPlan, hidden
) -> list[str]:
    """torch's `_preload_cuda_lib`: the candidates of the first sys.path entry that has any."""
    for entry in sys_path:
        found = _glob_first_in_listing_order(os.path.join(entry, "nvidia", folder, "lib"), pattern, hidden)
        if cuda_major is not None and plan.cu_major_folder:
            found += _glob_first_in_listing_order(
                os.path.join(entry, "nvidia", f"cu{cuda_major}", "lib"), pattern, hidden
            )
        found += _glob_first_in_listing_order(os.path.join(entry, folder, "lib"), pattern, hidden)
        if found:
            return found
    return []


def _import_error(miss: Resolution) -> str:
    return f"ImportError: {miss.soname}: cannot open shared object file: No such file or directory"


def _preload(
    proc: _Process, libs: Iterable[tuple[str, str]], sys_path: list[str], cuda_major, plan, hidden
) -> bool:
    """Run a preload list; stops at the first dlopen that fails, as torch's swallowed error does."""
    for folder, pattern in libs:
        candidates = preload_candidates(sys_path, folder, pattern, cuda_major, plan, hidden)
        if candidates and proc.dlopen_path(candidates[0], PRELOAD_REQUESTER):
            return False
    return True


def simulate_import(
    env: Environment,
    ld_library_path: str | None = None,
    ldcache: LdCache | None = None,
    hidden: Callable[[str], bool] | None = None,
    scan_extensions: bool = True,
) -> LibraryReport:
    """Resolve everything `import torch` (and later first use) loads, as this process would."""
    hide = hidden or (lambda _path: False)
    raw_llp = env.interpreter.ld_library_path if ld_library_path is None else ld_library_path
    llp = tuple(os.path.normpath(p) for p in re.split(r"[:;]", raw_llp or "") if p)
    cache = ldcache if ldcache is not None else load_system_cache()
    torch_dir = env.torch_dir
    build = env.torch
    cuda_major = build.cuda_major if build else None
    report = LibraryReport(
        torch_dir=torch_dir,
        site_dir=os.path.dirname(torch_dir) if torch_dir else None,
        cuda_major=cuda_major,
        ld_library_path=llp,
        plan=None,
    )
    if torch_dir is None:
        return report
    exe = env.read_elf(os.path.realpath(env.interpreter.executable)) if env.interpreter.executable else None
    proc = _Process(llp, cache, env.owners_of, hide, exe.rpath if exe else (), env.read_elf)
    plan = read_preload_plan(torch_dir) if cuda_major is not None else None
    report.plan = plan
    sys_path = list(env.interpreter.sys_path)
    lib_dir = os.path.join(torch_dir, "lib")

    # 1. _load_global_deps: libtorch_global_deps.so (RTLD_GLOBAL), then the CUDA preloads.
    global_deps = os.path.join(lib_dir, "libtorch_global_deps.so")
    if os.path.isfile(global_deps):
        misses = proc.dlopen_path(global_deps, PRELOAD_REQUESTER)
        if plan is not None:
            if misses:  # torch preloads everything (required) and retries
                _preload(proc, plan.libs, sys_path, cuda_major, plan, hide)
                for name in {m.soname for m in misses}:
                    proc.dlopen_name(name, proc.find("libtorch_global_deps.so"), global_deps)
                misses = [m for m in misses if m.soname not in proc.by_name]
            elif any(n.startswith("libcudart.so") for n in proc.by_name):
                _preload(proc, plan.success_path_libs, sys_path, cuda_major, plan, hide)
        if misses:
            report.import_error = (
                f"OSError: {misses[0].soname}: cannot open shared object file: No such file or directory"
            )

    # 2. Python imports torch._C: the NEEDED graph of libtorch*, libc10*, and what they pull in.
    for name in sorted(os.listdir(torch_dir)):
        if name.startswith("_C.") and name.endswith(".so"):
            misses = proc.dlopen_path(os.path.join(torch_dir, name), "python: import torch._C")
            if misses and report.import_error is None:
                report.import_error = _import_error(misses[0])

    if report.import_error is None:
        _after_import(env, report, proc, lib_dir, scan_extensions)
    report.resolutions = proc.resolutions
    report.by_soname = proc.by_soname
    return report


def _after_import(env: Environment, report: LibraryReport, proc: _Process, lib_dir: str, scan: bool) -> None:
    """What a process that imported torch loads later (skipped when the import itself fails)."""
    # Libraries torch dlopens on first use (cuSOLVER linalg, NVRTC): those that need CUDA libs.
    proc.stage = "lazy"
    for path in _shared_objects_in(lib_dir):
        info = proc.elf(path)
        if info is None or info.name in proc.by_name:
            continue
        if any(is_cuda_soname(n) for n in info.needed):
            proc.dlopen_path(path, "torch (dlopen on first use)")
    # Extension libraries of other packages that link CUDA libraries.
    if scan:
        proc.stage = "extension"
        for path in cuda_extension_libraries(env, proc.elf):
            report.extensions.append(path)
            if proc.present(path):
                proc.dlopen_path(path, f"import of {os.path.basename(path)}")


def _shared_objects_in(folder: str) -> list[str]:
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names if _SHARED_OBJECT.search(n)]


def shared_objects(env: Environment, extensions_only: bool = False) -> list[str]:
    """The shared objects every RECORD lists (no disk walk); `extensions_only`: not torch's own nor the nvidia-*
    libraries (which the import simulation reads itself)."""
    return [
        path
        for key, paths in env.library_paths.items()
        if not extensions_only or (key != "torch" and not key.startswith("nvidia-"))
        for path in paths
        if _SHARED_OBJECT.search(path)
    ]


def cuda_extension_libraries(env: Environment, read: Callable[[str], ElfInfo | None] = read_elf) -> list[str]:
    """ELF files of other distributions whose NEEDED names a CUDA library (from RECORD, no disk walk).

    torch's own files and the nvidia-* libraries are covered by the import simulation already.
    """
    candidates = shared_objects(env, extensions_only=True)
    env.prefetch_elf(candidates)  # a first run: ~800 headers of a GPU host's image, read in a few processes
    found: list[str] = []
    for path in candidates:
        info = read(path)
        if info is not None and any(is_cuda_soname(n) for n in info.needed):
            found.append(path)
    return found


def resolve_torch_libraries(
    env: Environment,
    ld_library_path: str | None = None,
    ldcache: LdCache | None = None,
    hidden: Callable[[str], bool] | None = None,
) -> LibraryReport:
    """The library report of `env`: what `import torch` loads, from where, and what it misses."""
    return simulate_import(env, ld_library_path, ldcache, hidden)


HEADERS = "libs.headers"


def start_reading_headers(ctx: CheckContext) -> None:
    """The `libs.*` checks' starter: on a first run (nothing in the parse cache) the ELF headers of every shared
    object the RECORDs list, ~1,000 files on a GPU host's image, are read in forked children while other checks
    run; a warm run finds them all in the cache and starts nothing."""
    env = ctx.env
    ctx.start(HEADERS, lambda: env.start_prefetch_elf(shared_objects(env)))


def library_report(ctx: CheckContext) -> LibraryReport:
    """The one LibraryReport of this check run (computed on first use, shared by every check)."""

    def build() -> LibraryReport:
        headers = ctx.started(HEADERS)
        if headers is not None:
            headers.absorb()
        return resolve_torch_libraries(ctx.env)

    return ctx.shared("libs.report", build)
