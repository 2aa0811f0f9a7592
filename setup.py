"""The one build step pyproject.toml cannot declare: the OPTIONAL native modules.

`agent/_bufferform.c` (the Buffer-form codec) and `agent/_sha256pair.c` (both digests of a chunk
in one pass) are built when a C compiler and the Python headers are there. When they are not,
`optional=True` lets the build go on without them: the agent runs on its pure decode path
(agent/protocol/bytearrays.py), about 3x slower, and hashes each chunk twice with hashlib
(agent/transfers/chunking.py), about 1.4x the CPU. That must not pass unnoticed, so then:

- the build prints a banner saying so (pip shows a build's output with `-v`);
- the wheel is tagged `py3-none-any`, what it holds, instead of the interpreter and platform
  tag of a wheel with native code: its file name tells which build it is;
- the agent logs `chunk_decoder_pure` at warning level at every start (agent/entry/app.py).

It also writes the version (`agent/_version.py`, read by `agent/__init__.py`): the release
`agent.RELEASE`, then how many commits and which one the build is made of, from git
(`0.1.0+412.g85e71b5c0a1d`, `.dirty` for a tree with changes; the release alone at a clean
`v<release>` tag). Without git (a source tree without `.git`) the file is left as it is.

Everything else about the package lives in pyproject.toml.
"""

import re
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError

_ROOT = Path(__file__).resolve().parent
_VERSION_FILE = _ROOT / "agent" / "_version.py"


def _git(*args: str) -> str | None:
    """git's answer in this checkout, None without git or a repository. `safe.directory`:
    a checkout another user owns (root building an operator's clone) is still read."""
    try:
        done = subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", str(_ROOT), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _write_version() -> None:
    """`agent/_version.py` from git: the release, then the commit count and the commit."""
    commit, count = _git("rev-parse", "--short=12", "HEAD"), _git("rev-list", "--count", "HEAD")
    if not commit or not count:
        return
    init = (_ROOT / "agent" / "__init__.py").read_text()
    release = re.search(r'^RELEASE = "([^"]+)"$', init, re.MULTILINE)
    if release is None:
        raise SystemExit("setup.py: agent/__init__.py names no RELEASE")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    tagged = _git("tag", "--points-at", "HEAD", "--list", f"v{release.group(1)}")
    version = release.group(1)
    if dirty or not tagged:
        version += f"+{count}.g{commit}" + (".dirty" if dirty else "")
    text = (
        '"""Written by the build (setup.py) from git; not in the repository."""\n\n'
        f'VERSION = "{version}"\n'
    )
    if not _VERSION_FILE.exists() or _VERSION_FILE.read_text() != text:
        _VERSION_FILE.write_text(text)


_write_version()

_NATIVE = "agent._bufferform"
_BUILD_ERRORS = (CCompilerError, CompileError, ExecError, PlatformError, OSError)


_PAIR = "agent._sha256pair"
_WITHOUT = {
    _NATIVE: (
        "the native chunk decoder",
        "  then decodes Buffer-form chunks on its pure path, about 3x slower, and says so at\n"
        "  every start (chunk_decoder_pure).",
    ),
    _PAIR: (
        "the native digest module",
        "  then hashes every chunk twice with hashlib, about 1.4x the CPU (its start-up line\n"
        "  says digests: hashlib).",
    ),
}


def _banner(name: str, reason: object) -> str:
    rule = "=" * 78
    what, then = _WITHOUT[name]
    return (
        f"\n{rule}\n"
        f"restore-agent: {what} ({name}) was NOT built: {reason}\n"
        "  A build without native code is a wheel tagged py3-none-any. The agent\n"
        f"{then}\n"
        "  For the native code install a C compiler and the Python headers (Debian:\n"
        "  build-essential python3-dev) and build again.\n"
        f"{rule}\n"
    )


class _BuildExt(build_ext):
    """build_ext that says loudly what it could not build."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except _BUILD_ERRORS as exc:
            print(_banner(ext.name, exc), file=sys.stderr, flush=True)
            raise  # setuptools goes on without an optional extension


class _BdistWheel(bdist_wheel):
    """bdist_wheel whose tag follows what the wheel holds: without the native module it is
    the pure wheel it is (`py3-none-any`)."""

    def get_tag(self) -> tuple[str, str, str]:
        # Called once the build is installed into bdist_dir, before the archive is named and
        # its WHEEL file written.
        native = [
            path
            for suffix in EXTENSION_SUFFIXES
            for name in (_NATIVE, _PAIR)
            for path in Path(self.bdist_dir).rglob(f"{name.rpartition('.')[2]}{suffix}")
        ]
        if not native:
            self.root_is_pure = True
        return super().get_tag()


setup(
    ext_modules=[
        Extension(
            _NATIVE,
            sources=["agent/_bufferform.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        # Both digests of staging and the closures in one pass (SHA-NI); hashlib without it.
        Extension(
            _PAIR,
            sources=["agent/_sha256pair.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": _BuildExt, "bdist_wheel": _BdistWheel},
)
