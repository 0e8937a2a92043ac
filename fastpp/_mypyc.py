"""``mypyc_attr`` for the modules the optional compiled build compiles (fastpp/_native.py).

A public class of those modules is marked ``@mypyc_attr(allow_interpreted_subclasses=True)``:
compiled, it stays subclassable from Python, and an override is called by compiled callers too
(a custom scheduler subclasses ``Scheduler`` or ``PredictiveChunkPolicy``, or ``Request``).
mypyc reads the mark at compile time; at run time it is a no-op, so ``mypy_extensions`` (which
mypy brings, the build's tool) is not needed to run fastpp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:
    try:
        from mypy_extensions import mypyc_attr
    except ImportError:  # not installed: the mark does nothing in Python anyway

        def mypyc_attr(*_args, **_kwargs):
            return lambda cls: cls


__all__ = ["mypyc_attr"]
