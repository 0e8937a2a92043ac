"""Regenerate the analytic profiles shipped in profiles/ (run from the repo root).

python scripts/make_profiles.py [OUT_DIR]
"""

from __future__ import annotations

import sys

from fastpp.sim.analytic import write_default_profiles

if __name__ == "__main__":
    for path in write_default_profiles(sys.argv[1] if len(sys.argv) > 1 else "profiles"):
        print(path)
