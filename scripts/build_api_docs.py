"""Build the API reference (a static HTML site) from the docstrings of the public API.

    python scripts/build_api_docs.py [--out site/api]

Documents exactly ``fastpp.__all__`` with pdoc. Strict: any warning pdoc raises (a name in
``__all__`` that does not resolve, a docstring it cannot render) is an error, so CI fails on a
broken docstring instead of publishing it.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

os.environ["FASTPP_NATIVE"] = "0"  # the Python source: compiled modules carry no docstrings

import pdoc
import pdoc.render

import fastpp


def build(out: Path) -> Path:
    for name in fastpp.__all__:  # the simulator's names are imported on first use: resolve them
        getattr(fastpp, name)
    pdoc.render.configure(
        docformat="restructuredtext",
        search=True,
        show_source=False,
        footer_text=f"fastpp {fastpp.__version__}",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pdoc.pdoc("fastpp", r"!fastpp\..*", output_directory=out)  # the facade page only
    return out / "fastpp.html"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("site/api"), help="output folder [default: site/api]")
    args = ap.parse_args()
    page = build(args.out)
    print(f"wrote {page}")


if __name__ == "__main__":
    main()
