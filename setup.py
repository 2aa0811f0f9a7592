"""The one build step pyproject.toml cannot declare: the OPTIONAL native Buffer-form codec.

`agent/_bufferform.c` is built when a C compiler and the Python headers are there; when they are
not, `optional=True` lets the build go on without it (setuptools warns) and the agent runs on
its pure decode path (agent/protocol/bytearrays.py says which one it chose). Everything else
about the package lives in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "agent._bufferform",
            sources=["agent/_bufferform.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
