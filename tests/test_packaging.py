"""Packaging: one version, an SPDX licence, pinned installs that honour the floors, and a
build without a compiler that says what it lacks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
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


def test_a_wheel_built_without_a_compiler_says_so_and_is_tagged_pure(tmp_path: Path) -> None:
    """No working C compiler: the build prints a banner naming the missing native decoder, and
    the wheel holds no native module and is tagged py3-none-any instead of this platform."""
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "node_modules", "build", "dist", "*.egg-info", "__pycache__",
            ".*cache", "*.so",
        ),
    )  # fmt: skip
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "--verbose",
            "--wheel-dir",
            str(tmp_path / "dist"),
        ],
        env={**os.environ, "CC": "false"},  # a compiler that fails every compile
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "restore-agent: the native chunk decoder (agent._bufferform) was NOT built" in (
        done.stdout + done.stderr
    )
    [wheel] = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert [name for name in names if name.startswith("agent/_bufferform.")] == [
        "agent/_bufferform.pyi"
    ]
