"""Build the optional Cython hot path.

Every ``_speedups/<name>.pyx`` becomes the extension module named in ``_EXTENSIONS`` (inside the
``luftpause`` package, beside its pure-Python twin); ``_facts_c`` cimports ``_sse_c``'s declarations
from ``_speedups/luftpause.dataplane._sse_c.pxd``, which Cython finds beside the sources by that
module's full name. The extensions are optional, as in aiohttp and
yarl: without Cython or a C compiler, or with ``LUFTPAUSE_NO_EXTENSIONS=1``, the package installs as
pure Python and the selectors fall back to the twins.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

# source under _speedups/ -> module inside the package
_EXTENSIONS = {
    "_speedups/_sse_c.pyx": "luftpause.dataplane._sse_c",
    "_speedups/_facts_c.pyx": "luftpause.dataplane.apis._facts_c",
    "_speedups/_tool_calls_c.pyx": "luftpause.tool_calls._tool_calls_c",
}

NO_EXTENSIONS = os.environ.get("LUFTPAUSE_NO_EXTENSIONS", "") not in ("", "0")


class OptionalBuildExt(build_ext):
    """Keep going when a compiler is missing: the pure twins serve instead."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # pragma: no cover - depends on the machine
            print(f"luftpause: building the C hot path failed ({exc}); using pure Python", file=sys.stderr)

    def build_extension(self, ext: object) -> None:
        try:
            super().build_extension(ext)  # type: ignore[arg-type]
        except Exception as exc:  # pragma: no cover - depends on the machine
            print(f"luftpause: building {ext} failed ({exc}); using pure Python", file=sys.stderr)


def _extensions() -> list[object]:
    if NO_EXTENSIONS:
        return []
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError:
        print("luftpause: Cython not installed; using pure Python", file=sys.stderr)
        return []
    exts = [Extension(module, [source]) for source, module in _EXTENSIONS.items()]
    return list(cythonize(exts, language_level=3, quiet=True))


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
