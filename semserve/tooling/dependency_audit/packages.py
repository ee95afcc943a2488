"""The distributions to audit: the running environment's, or NAME==VERSION given on the command
line, with the name and version normalizations advisories are filed under."""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterable
from dataclasses import dataclass


def canonical(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public_version(version: str) -> str:
    """`2.13.0+cpu` -> `2.13.0` (PEP 440 local version label dropped)."""
    return version.split("+", 1)[0]


def same_version(a: str, b: str) -> bool:
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - packaging is everywhere pip-installed things are
        return a.strip().lower() == b.strip().lower()
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a.strip().lower() == b.strip().lower()


@dataclass(frozen=True)
class Dist:
    name: str
    version: str

    @classmethod
    def parse(cls, spec: str) -> Dist:
        name, sep, version = spec.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"expected NAME==VERSION, got {spec!r}")
        return cls(name.strip(), version.strip())


def installed_distributions(skip: Iterable[str] = ("semserve",)) -> list[Dist]:
    """The running environment's distributions, one per project name, without `skip`."""
    skipped = {canonical(s) for s in skip}
    seen: dict[str, Dist] = {}
    for d in importlib.metadata.distributions():
        name = d.metadata["Name"]
        if not name:
            continue
        key = canonical(name)
        if key in skipped or key in seen:
            continue
        seen[key] = Dist(name, d.version)
    return sorted(seen.values(), key=lambda d: canonical(d.name))
