"""The one build step pyproject.toml cannot declare: the OPTIONAL native modules.

`agent/_bufferform.c` (the Buffer-form codec) and `agent/_sha256pair.c` (both digests of a chunk
in one pass) are built when a C compiler and the Python headers are there. When they are not,
`optional=True` lets the build go on without them: the agent runs on its pure decode path
(agent/protocol/bytearrays.py), about 3x slower, and hashes each chunk twice with hashlib
(agent/chunking.py), about 1.4x the CPU. That must not pass unnoticed, so then:

- the build prints a banner saying so (pip shows a build's output with `-v`);
- the wheel is tagged `py3-none-any`, what it holds, instead of the interpreter and platform
  tag of a wheel with native code: its file name tells which build it is;
- the agent logs `chunk_decoder_pure` at warning level at every start (agent/app.py).

Everything else about the package lives in pyproject.toml.
"""

import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError

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
