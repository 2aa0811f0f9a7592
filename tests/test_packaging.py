"""Packaging: one version, an SPDX licence, pinned installs that honour the floors, and a
build without a compiler that says what it lacks."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import agent

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _locked(lock: str) -> dict[str, tuple[Version, list[str]]]:
    """`locks/LOCK`: each package's pinned version and its sha256 hashes."""
    locked: dict[str, tuple[Version, list[str]]] = {}
    name = ""
    for line in (ROOT / "locks" / lock).read_text().splitlines():
        stripped = line.strip().removesuffix("\\").strip()
        if not stripped or stripped.startswith("#"):
            continue
        if "==" in stripped and not stripped.startswith("--"):
            name, _, version = stripped.partition("==")
            name = canonicalize_name(name)
            locked[name] = (Version(version), [])
        elif stripped.startswith("--hash=sha256:"):
            locked[name][1].append(stripped.removeprefix("--hash=sha256:"))
        else:
            raise AssertionError(f"locks/{lock}: an option a lock must not carry: {stripped}")
    return locked


def _pins() -> dict[str, Version]:
    return {name: version for name, (version, _) in _locked("runtime.txt").items()}


def test_the_version_lives_in_the_package_only() -> None:
    """pyproject reads the version from `agent.__version__`; it writes none of its own."""
    assert "version" not in PROJECT
    assert "version" in PROJECT["dynamic"]
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["dynamic"]["version"] == {"attr": "agent.__version__"}


def test_the_licence_is_an_spdx_expression() -> None:
    """`license = "MIT"` (PEP 639), not the deprecated table form."""
    assert PROJECT["license"] == "MIT"


def test_the_runtime_lock_pins_every_dependency_within_its_floor() -> None:
    """locks/runtime.txt pins each runtime dependency exactly, at a version its floor allows."""
    pins = _pins()
    for text in PROJECT["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned in locks/runtime.txt"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} breaks {text}"


def test_every_locked_package_carries_sha256_hashes_and_no_index() -> None:
    """Each package of each lock has at least one sha256 (pip's --require-hashes needs them),
    and no lock names an index or a local path (a lock is the same on every machine)."""
    for lock in ("runtime.txt", "build.txt", "dev.txt"):
        locked = _locked(lock)
        assert locked, lock
        for name, (_, hashes) in locked.items():
            assert hashes, f"locks/{lock}: {name} has no hash"
            assert all(len(h) == 64 for h in hashes), f"locks/{lock}: {name}"


def test_the_dev_lock_holds_the_runtime_lock_at_the_same_versions() -> None:
    """The tests run with exactly what a node installs: dev.txt pins each runtime package at
    its runtime.txt version, and the build backend the build lock names."""
    dev = _locked("dev.txt")
    for name, (version, _) in _locked("runtime.txt").items():
        assert dev[name][0] == version, name
    assert dev["setuptools"][0] == _locked("build.txt")["setuptools"][0]


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
    said = done.stdout + done.stderr
    assert "restore-agent: the native chunk decoder (agent._bufferform) was NOT built" in said
    assert "restore-agent: the native digest module (agent._sha256pair) was NOT built" in said
    [wheel] = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    native = [
        name for name in names if name.startswith(("agent/_bufferform.", "agent/_sha256pair."))
    ]
    assert native == ["agent/_bufferform.pyi", "agent/_sha256pair.pyi"]


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(  # a fixed argument list
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_build_names_the_commit_it_was_made_of(tmp_path: Path) -> None:
    """A build from a clone writes the release, the commit count and the commit; a commit more
    is another version (pip never takes a new build for the installed one), and changes to a
    tracked file say `.dirty`."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)

    def built() -> str:
        subprocess.run(  # setup.py writes the version as any build does
            [sys.executable, "setup.py", "--version"],
            cwd=clone,
            capture_output=True,
            check=True,
            timeout=120,
        )
        written = (clone / "agent" / "_version.py").read_text()
        [version] = re.findall(r'^VERSION = "([^"]+)"$', written, re.MULTILINE)
        return version

    count, commit = _git(clone, "rev-list", "--count", "HEAD"), _git(clone, "rev-parse", "HEAD")
    first = built()
    assert first == f"{agent.RELEASE}+{count}.g{commit[:12]}"
    (clone / "readme.md").write_text("changed\n")
    assert built() == f"{first}.dirty"
    _git(clone, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", "next")
    second = built()
    assert Version(second) > Version(first)
    assert second.startswith(f"{agent.RELEASE}+{int(count) + 1}.g")
