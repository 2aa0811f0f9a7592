"""Packaging: one version, an SPDX licence, and pinned installs that honour the floors."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_the_version_lives_in_the_package_only() -> None:
    """pyproject reads the version from `agent.__version__`; it writes none of its own."""
    assert "version" not in PROJECT
    assert "version" in PROJECT["dynamic"]
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["dynamic"]["version"] == {"attr": "agent.__version__"}


def test_the_licence_is_an_spdx_expression() -> None:
    """`license = "MIT"` (PEP 639), not the deprecated table form."""
    assert PROJECT["license"] == "MIT"


def test_constraints_pin_every_dependency_within_its_floor() -> None:
    """constraints.txt pins each runtime dependency exactly, at a version its floor allows."""
    pins = _pins()
    for text in PROJECT["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} breaks {text}"
