"""The spread of CNN/DailyMail article lengths (CNN-Reversed's output lengths), from public data.

    python scripts/cnn_article_spread.py

Why. ``cnn-reversed-synthetic`` draws output lengths from a lognormal with mean 883 tokens
(PAPER.md) and CV 0.5. The paper gives only the mean, and the dataset is not reachable from this
machine (../shared/data/README.md). Whether delay scheduling can gain on CNN-Reversed with
Qwen2.5-32B on 4 x A100-40GB depends on that spread (README, "Results"): a resident request
holds prompt + E[out^2] / (2 E[out]) KV tokens, so the spread sets how many requests the KV
pool holds, and DS's first tier needs 4 x 128 = 512 running.

Source. A histogram of ``len(article)`` in characters over the 287,113 training articles of
Hugging Face ``cnn_dailymail`` 3.0.0 (pandas ``hist``, 30 equal bins over the data's range),
published as ``assets/article_len_dist.png`` in github.com/yxiong/cnn_dailymail (Apache-2.0,
commit 196531a; made by ``colab_notebooks/dataset.ipynb``). The figure prints the mean
(4033.66) and median (3682.00). The bar heights below were read off the figure's pixels (axis
ticks every 5,000 articles at 100 px, so one pixel is 50 articles); bins 21-29 hold under one
pixel each (the 613 articles the visible bars miss) and are bounded separately.

Characters, not tokens: the ratio of characters to tokens varies little across news articles, so
the CV in tokens is taken as the CV in characters (a varying ratio could only widen the spread
a little, which lowers residency further: the conclusion below would hold more strongly).
"""

from __future__ import annotations

import numpy as np

from fastpp.workloads import WORKLOADS

TRAIN_ARTICLES = 287_113
PRINTED_MEAN_CHARS = 4033.66
PRINTED_MEDIAN_CHARS = 3682.0
BIN_LOW_CHARS = 35.0  # left edge of the first bin (x-axis ticks: 2,000 characters per 114 px)
BIN_WIDTH_CHARS = 525.8
# Articles per bin, bins 0..20 (read from the figure; +-50 per bar).
BAR_COUNTS = (
    300,
    4600,
    15100,
    25900,
    32900,
    35200,
    33600,
    30000,
    25000,
    20500,
    15900,
    12100,
    9200,
    7100,
    5500,
    4200,
    3300,
    2700,
    2000,
    1000,
    400,
)
LAST_BIN = 29  # 30 bins; 21..29 are below one pixel each
QUANTILES = (0.1, 0.5, 0.9, 0.99)
WORKLOAD = "cnn-reversed-synthetic"

MEAN_OUT_TOKENS = 883  # PAPER.md: CNN/DailyMail mean input, CNN-Reversed's mean output
MEAN_IN_TOKENS = 65
KV_POOL_TOKENS = 311_591  # Qwen2.5-32B, PP=4, A100-40GB, mem_fraction 0.9 (README, "Results")
FIRST_TIER = 4 * 128  # DS's first tier: 128 decodes per microbatch x D_p = 4


def moments(counts: np.ndarray, centres: np.ndarray, width: float) -> tuple[float, float]:
    """Mean and standard deviation of a histogram, each bin spread uniformly over its width."""
    mean = float((counts * centres).sum() / counts.sum())
    var = float((counts * (centres - mean) ** 2).sum() / counts.sum()) + width**2 / 12
    return mean, var**0.5


def quantile(counts: np.ndarray, low: float, width: float, q: float) -> float:
    """Quantile ``q`` of a histogram, each bin spread uniformly over its width."""
    cum = np.cumsum(counts) / counts.sum()
    k = int(np.searchsorted(cum, q))
    before = cum[k - 1] if k else 0.0
    return low + width * (k + (q - before) / (counts[k] / counts.sum()))


def residents(cv: float) -> tuple[float, float]:
    """KV tokens per resident CNN-Reversed request at output CV ``cv``, and how many fit."""
    per_request = MEAN_IN_TOKENS + MEAN_OUT_TOKENS * (1 + cv**2) / 2
    return per_request, KV_POOL_TOKENS / per_request


def centres(num_bins: int) -> np.ndarray:
    return BIN_LOW_CHARS + (np.arange(num_bins) + 0.5) * BIN_WIDTH_CHARS


def cv_bounds() -> list[tuple[int, float, float]]:
    """(bin, mean, CV) with the articles the visible bars miss all in the first bin past them
    (least spread) or all in the last bin (most spread): the CV lies between the two."""
    visible = np.array(BAR_COUNTS, dtype=float)
    bounds = []
    for tail_bin in (len(visible), LAST_BIN):
        counts = np.zeros(LAST_BIN + 1)
        counts[: len(visible)] = visible
        counts[tail_bin] += TRAIN_ARTICLES - visible.sum()
        m, s = moments(counts, centres(LAST_BIN + 1), BIN_WIDTH_CHARS)
        bounds.append((tail_bin, m, s / m))
    return bounds


def main() -> None:
    visible = np.array(BAR_COUNTS, dtype=float)
    mean, std = moments(visible, centres(len(visible)), BIN_WIDTH_CHARS)
    print(
        f"visible bars: {visible.sum():,.0f} of {TRAIN_ARTICLES:,} articles; mean {mean:,.0f} "
        f"chars (figure: {PRINTED_MEAN_CHARS:,.0f}), median "
        f"{quantile(visible, BIN_LOW_CHARS, BIN_WIDTH_CHARS, 0.5):,.0f} (figure: "
        f"{PRINTED_MEDIAN_CHARS:,.0f}), CV {std / mean:.3f}"
    )
    bounds = cv_bounds()
    for tail_bin, m, cv in bounds:
        print(
            f"  with the {TRAIN_ARTICLES - visible.sum():,.0f} missing articles in bin "
            f"{tail_bin}: mean {m:,.0f} chars, CV {cv:.3f}"
        )
    low, high = bounds[0][2], bounds[1][2]
    print(f"output-length CV of CNN-Reversed: {low:.2f} to {high:.2f} (cnn-reversed-synthetic assumes 0.50)")

    # Shape: quantiles relative to the mean, the histogram against the registered sampler.
    _, out = WORKLOADS[WORKLOAD].make_sampler().sample(np.random.default_rng(0), 200_000)
    print(f"{'quantile / mean':<24}" + "".join(f"{f'p{round(100 * q)}':>6}" for q in QUANTILES))
    print(
        f"{'articles (histogram)':<24}"
        + "".join(f"{quantile(visible, BIN_LOW_CHARS, BIN_WIDTH_CHARS, q) / mean:6.2f}" for q in QUANTILES)
    )
    print(f"{WORKLOAD:<24}" + "".join(f"{np.quantile(out, q) / out.mean():6.2f}" for q in QUANTILES))

    print(
        f"KV per resident request (65 + 883 (1 + CV^2) / 2) and requests in the "
        f"{KV_POOL_TOKENS:,}-token pool; DS's first tier is {FIRST_TIER} running:"
    )
    for cv in (low, high, 0.5, 0.3):
        per_request, fit = residents(cv)
        note = "  (the sensitivity run, benchmarks/ds_kv_sensitivity.py)" if cv == 0.3 else ""
        print(
            f"  CV {cv:.3f}: {per_request:5.0f} tokens, {fit:5.0f} requests "
            f"({'above' if fit > FIRST_TIER else 'below'} the tier){note}"
        )


if __name__ == "__main__":
    main()
