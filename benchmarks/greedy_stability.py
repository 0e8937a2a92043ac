"""Do a served engine's temperature-0 tokens depend on how the requests were batched?

    python benchmarks/greedy_stability.py --backend vllm                      # stock vLLM, its dtype
    python benchmarks/greedy_stability.py --backend vllm -- --dtype float32
    python benchmarks/greedy_stability.py --backend vllm --policy static -- --dtype float32

Serves SmolLM2-135M pp 2 (``fastpp serve --backend BACKEND --model smollm2 --pp 2 --policy
POLICY [engine args]``; vllm and sglang need the engine environments of scripts/engines/), sends
the same prompts one by one (the reference: each alone in its batches), then ``--sends`` times all
at once, and prints which prompts' greedy tokens differ from the reference in each concurrent
send, and the smallest gaps between the top two logprobs over the reference's tokens: where two
candidates tie, a different batch shape can round the other way and the tokens part from there.

Why: tests/test_vllm_backend.py compares our scheduler's tokens with stock vLLM's, which is only a
test of the scheduler if stock vLLM's own tokens do not move with batching (docs/engines/vllm.md,
"Exact tokens").
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx

from fastpp.backends.openai_server.launcher import ServerProcess

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "List three colors:",
    "The quick brown fox",
    "In 1492, Columbus sailed",
    "Water boils at",
    "My favourite food is",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="vllm", choices=["vllm", "sglang", "torch"])
    p.add_argument("--policy", default="stock", help="stock: the engine's own scheduler (vllm, sglang)")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--sends", type=int, default=3, help="concurrent sends of all prompts")
    args, engine_args = p.parse_known_args(argv)
    engine_args = engine_args[1:] if engine_args[:1] == ["--"] else engine_args
    cmd = [
        "--backend",
        args.backend,
        "--model",
        "smollm2",
        "--pp",
        "2",
        "--policy",
        args.policy,
        *engine_args,
    ]
    print("fastpp serve " + " ".join(cmd), flush=True)
    with ServerProcess(*cmd, start_timeout_s=900) as server:
        model = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]

        def complete(prompt: str, logprobs: int | None = None) -> dict:
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            if logprobs:
                body["logprobs"] = logprobs
            r = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
            r.raise_for_status()
            return r.json()["choices"][0]

        reference = [complete(prompt, logprobs=2) for prompt in PROMPTS]
        ref_tokens = [c["token_ids"] for c in reference]
        gaps = []
        for i, choice in enumerate(reference):
            for j, top in enumerate(choice["logprobs"]["top_logprobs"]):
                best = sorted(top.values(), reverse=True)
                if len(best) > 1:
                    gaps.append((best[0] - best[1], i, j))
        gaps.sort()
        print(f"reference (one by one): {len(PROMPTS)} prompts x {args.max_tokens} tokens")
        print(
            "smallest top-2 logprob gaps (gap, prompt, token): "
            + ", ".join(f"({g:.4f}, {i}, {j})" for g, i, j in gaps[:5])
        )
        print(f"exact ties (gap 0): {sum(g == 0 for g, _, _ in gaps)} of {len(gaps)} tokens")
        moved = 0
        for send in range(1, args.sends + 1):
            with ThreadPoolExecutor(len(PROMPTS)) as pool:
                tokens = [c["token_ids"] for c in pool.map(complete, PROMPTS)]
            pairs = enumerate(zip(tokens, ref_tokens, strict=True))
            parted = {i: _first_difference(a, b) for i, (a, b) in pairs if a != b}
            moved += bool(parted)
            print(
                f"concurrent send {send}: {len(parted)} of {len(PROMPTS)} prompts differ from the reference"
                + (f" (prompt: first differing token {parted})" if parted else "")
            )
        print("greedy tokens " + ("MOVE" if moved else "did not move") + " with batching")
    return 0


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


if __name__ == "__main__":
    sys.exit(main())
