"""What a check says: a finding with a severity, evidence and a remedy (think `flutter doctor`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Severity(str, enum.Enum):
    OK = "ok"
    SKIP = "skip"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Severity.OK: 0, Severity.SKIP: 1, Severity.WARN: 2, Severity.FAIL: 3}


@dataclass(frozen=True)
class Finding:
    """One verdict.

    ``id`` is stable and dotted (``libs.missing``); tools and `--only` rely on it.
    ``evidence`` holds JSON-able facts (paths, versions, hashes) that let a person verify the verdict.
    ``remedy`` is a command a person can paste, or None when there is nothing to do.
    """

    id: str
    severity: Severity
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    remedy: str | None = None

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.value,
            "summary": self.summary,
            "evidence": self.evidence,
            "remedy": self.remedy,
        }


def ok(id: str, summary: str, **evidence: Any) -> Finding:
    return Finding(id, Severity.OK, summary, evidence)


def skip(id: str, summary: str, **evidence: Any) -> Finding:
    return Finding(id, Severity.SKIP, summary, evidence)


def warn(id: str, summary: str, remedy: str | None = None, **evidence: Any) -> Finding:
    return Finding(id, Severity.WARN, summary, evidence, remedy)


def fail(id: str, summary: str, remedy: str | None = None, **evidence: Any) -> Finding:
    return Finding(id, Severity.FAIL, summary, evidence, remedy)


def worst(findings: list[Finding]) -> Severity:
    return max((f.severity for f in findings), key=lambda s: s.rank, default=Severity.OK)
