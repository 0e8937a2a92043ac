"""Derive fastpp/data/length_tables.json from the Azure LLM inference trace 2023.

The JSON holds derived figures only (quantiles, summary statistics, a rank correlation, the
source file's sha256), never the rows, so the package can sample Azure-like lengths without
the data directory. Run from anywhere:

    python scripts/derive_length_tables.py [--data-dir ../shared/data] [--out fastpp/data/...]

The data directory defaults to ../shared/data relative to the repository root.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from fastpp.length_files import read_azure_trace

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
DEFAULT_OUT = REPO_ROOT / "fastpp" / "data" / "length_tables.json"

AZURE_SOURCE = (
    "Azure LLM inference trace 2023 ({file}), Azure/AzurePublicDataset, CC BY 4.0; "
    "Patel et al., 'Splitwise: Efficient generative LLM inference using phase splitting', "
    "ISCA 2024"
)
TRACES = {
    "azure-conv": "azure/AzureLLMInferenceTrace_conv.csv",
    "azure-code": "azure/AzureLLMInferenceTrace_code.csv",
}
PROBABILITIES = [round(i * 0.005, 3) for i in range(201)]  # 0, 0.005, ..., 1
# Finer knots in the top 0.5%, where one linear segment up to the max would inflate the mean.
TAIL_PROBABILITIES = [0.996, 0.997, 0.998, 0.999, 0.9995, 0.9999]


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (as Spearman's rho needs)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2.0)[inverse]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(average_ranks(x), average_ranks(y))[0, 1])


def marginal(values: np.ndarray) -> dict:
    quantiles = np.quantile(values, PROBABILITIES)
    tail = np.quantile(values, TAIL_PROBABILITIES)
    return {
        "mean": round(float(values.mean()), 3),
        "median": float(np.median(values)),
        "p90": round(float(np.quantile(values, 0.9)), 3),
        "p99": round(float(np.quantile(values, 0.99)), 3),
        "max": int(values.max()),
        "quantiles": [round(float(q), 3) for q in quantiles],
        "tail_quantiles": [round(float(q), 3) for q in tail],
    }


def derive(data_dir: Path) -> dict:
    tables = {}
    for name, relative in TRACES.items():
        path = data_dir / relative
        trace = read_azure_trace(path)
        tables[name] = {
            "source": AZURE_SOURCE.format(file=path.name),
            "file": relative,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "num_rows": len(trace),
            "num_clamped_outputs": trace.num_clamped_outputs,
            "duration_s": round(trace.duration_s, 3),
            "rank_correlation": round(spearman(trace.prompt_lens, trace.output_lens), 6),
            "input": marginal(trace.prompt_lens),
            "output": marginal(trace.output_lens),
        }
    return {
        "format": 1,
        "generated_by": "scripts/derive_length_tables.py",
        "note": "Derived figures (numpy linear quantiles, Spearman rho) of token lengths; "
        "no rows of the source data. Lengths in tokens, durations in seconds.",
        "probabilities": PROBABILITIES,
        "tail_probabilities": TAIL_PROBABILITIES,
        "tables": tables,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help="folder holding azure/AzureLLMInferenceTrace_*.csv",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    args = parser.parse_args(argv)
    document = derive(args.data_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    for name, table in document["tables"].items():
        print(
            f"{name}: {table['num_rows']} rows, input mean {table['input']['mean']}, "
            f"output mean {table['output']['mean']}, rho {table['rank_correlation']}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
