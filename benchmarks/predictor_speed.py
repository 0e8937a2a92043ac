"""Predictor hot-path cost: ``predict_one`` and ``partial_fit`` (one online RLS step).

    python benchmarks/predictor_speed.py              # 100k calls each, ALP and tokens-only
    python benchmarks/predictor_speed.py --calls 20000

Times every call with ``perf_counter_ns`` and prints the median and p99 in microseconds, with
the timer's own cost (an empty timed region) shown beside them and not subtracted. For
comparison it also times the same RLS step written with numpy 4x4 linear algebra, the reason
``ALPPredictor.learn_one`` is unrolled pure Python. Pin to one core with ``taskset -c 0``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

from fastpp.predictor import ALPPredictor, TokensOnlyPredictor
from fastpp.profile import LinearTable

# a stepped table like an A100's (128-token tiles), seconds
TABLE = LinearTable(
    tuple(n for k in range(1, 17) for n in (128 * k, 128 * k + 1)),
    tuple(s for k in range(1, 17) for s in (4e-4 * k, 4e-4 * (k + 1))),
)


def _inputs(n: int, seed: int) -> list[tuple[int, int, int, int, float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        num_tokens = rng.randint(1, 2048)
        a, s, d = rng.randint(0, 4_000_000), rng.randint(0, 500_000), rng.randint(0, 200_000)
        y = TABLE.at(num_tokens) + 2e-9 * a + 1e-9 * s + 2e-8 * d + 3e-4
        out.append((num_tokens, a, s, d, y * (1.0 + rng.gauss(0.0, 0.01))))
    return out


def _report(name: str, samples_ns: list[int]) -> None:
    samples_ns.sort()
    p99 = samples_ns[int(0.99 * (len(samples_ns) - 1))]
    print(f"{name:<34} median {statistics.median(samples_ns) / 1e3:6.2f} us   p99 {p99 / 1e3:6.2f} us")


def _time_calls(fn, args_list) -> list[int]:
    clock = time.perf_counter_ns
    out = []
    for args in args_list:
        t0 = clock()
        fn(*args)
        out.append(clock() - t0)
    return out


def _numpy_rls_step(state: dict, x: np.ndarray, r: float, lam: float = 0.9975) -> None:
    """The same RLS step with numpy (for comparison only)."""
    e = r - state["theta"] @ x
    q = state["P"] @ x
    g = q / (lam + x @ q)
    state["theta"] = state["theta"] + g * e
    state["P"] = (state["P"] - np.outer(g, q)) / lam


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data = _inputs(args.calls, args.seed)

    _report("timer overhead (empty region)", _time_calls(lambda: None, [()] * args.calls))
    for cls in (ALPPredictor, TokensOnlyPredictor):
        pred = cls(TABLE)
        _report(f"{cls.__name__}.predict_one", _time_calls(pred.predict_one, [d[:4] for d in data]))
        _report(f"{cls.__name__}.partial_fit", _time_calls(pred.partial_fit, [(d[:4], d[4]) for d in data]))
        _report(f"{cls.__name__}.learn_one", _time_calls(pred.learn_one, data))

    scales = np.array([2.0**-21, 2.0**-20, 1e-5, 1.0])
    state = {"theta": np.zeros(4), "P": np.eye(4)}
    vecs = [(state, np.array([d[1], d[2], d[3], 1.0]) * scales, d[4] - TABLE.at(d[0])) for d in data]
    _report("numpy 4x4 RLS step (comparison)", _time_calls(_numpy_rls_step, vecs))


if __name__ == "__main__":
    main()
