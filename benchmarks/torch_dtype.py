"""float32 vs bfloat16 speed on this CPU: matmuls of SmolLM2-135M's shapes and a stage forward.

    python benchmarks/torch_dtype.py              # one intra-op thread, as a stage process runs
    python benchmarks/torch_dtype.py --threads 2

Prints the median time of each case in both dtypes and the ratio float32 / bfloat16 (above 1:
bfloat16 is faster). Whether bfloat16 wins depends on the ISA torch dispatches to (AVX-512 BF16 or
AMX make it fast; on AVX2 it is emulated), which is printed first. Warm-up calls are discarded.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from fastpp.backends.torch import BatchLayout, build_stages, get_config, random_weights

DTYPES = (torch.float32, torch.bfloat16)


def median_s(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_case(rows: int, k: int, n: int, dtype: torch.dtype, repeats: int) -> float:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    return median_s(lambda: torch.nn.functional.linear(x, w), repeats)


def stage_case(num_tokens: int, dtype: torch.dtype, repeats: int, num_layers: int) -> float:
    """One prefill of ``num_tokens`` through a whole model of SmolLM2's shape with ``num_layers``."""
    config = replace(get_config("smollm2-135m"), name="smollm2-bench", num_layers=num_layers)
    (stage,) = build_stages(random_weights(config, seed=0), 1, dtype=dtype)
    cache = stage.make_kv_cache(num_blocks=-(-num_tokens // 16))
    cache.allocate(0, num_tokens)
    layout = BatchLayout.build([(0, num_tokens, 0, True)])
    ids = torch.randint(0, config.vocab_size, (num_tokens,), generator=torch.Generator().manual_seed(0))
    return median_s(lambda: stage(ids, layout, cache), repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--repeats", type=int, default=10, help="timed calls per case")
    ap.add_argument("--layers", type=int, default=4, help="layers in the stage-forward case")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}, "
        f"threads {torch.get_num_threads()}"
    )
    cases: list[tuple[str, Callable[[torch.dtype], float]]] = []
    for rows in (1, 16, 128, 512):
        cases.append(
            (
                f"linear [{rows}x576]x[576x1536]",
                lambda dt, r=rows: matmul_case(r, 576, 1536, dt, args.repeats),
            )
        )
    for rows in (1, 16):
        cases.append(
            (
                f"lm_head [{rows}x576]x[576x49152]",
                lambda dt, r=rows: matmul_case(r, 576, 49152, dt, args.repeats),
            )
        )
    for tokens in (16, 128):
        cases.append(
            (
                f"prefill {tokens} tok, {args.layers} layers + lm_head",
                lambda dt, t=tokens: stage_case(t, dt, max(3, args.repeats // 2), args.layers),
            )
        )
    print(f"{'case':<44} {'float32 ms':>11} {'bfloat16 ms':>12} {'f32/bf16':>9}")
    ratios = []
    for name, fn in cases:
        f32, bf16 = (fn(dt) * 1e3 for dt in DTYPES)
        ratios.append(f32 / bf16)
        print(f"{name:<44} {f32:>11.3f} {bf16:>12.3f} {f32 / bf16:>9.2f}")
    print(f"geometric mean float32/bfloat16 time ratio: {statistics.geometric_mean(ratios):.2f}")


if __name__ == "__main__":
    main()
