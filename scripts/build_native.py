"""Kept for old instructions: the builder is part of the package, ``python -m fastpp.native_build``
(fastpp/native_build.py; it works from an installed wheel too). Same options (``--check``)."""

from fastpp.native_build import main

if __name__ == "__main__":
    main()
