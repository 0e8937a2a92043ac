"""The analytic cost model against a real GPU: one pipeline stage of Qwen2.5-32B, measured.

The simulator's GPU side is the analytic model of sim/analytic.py (roofline per operator,
kernel efficiencies fitted on vidur's A100/H100 tables). This script checks it where a GPU is at
hand: it times one middle stage of a PP=4 Qwen2.5-32B (16 decoder layers, BF16, random weights,
no embedding or LM head) on the batch shapes a PP engine runs, and sets each time beside the
model's prediction for the same microbatch.

Three steps, so that the GPU machine needs nothing but PyTorch:

    python benchmarks/gpu_stage_check.py plan --gpu H200 -o cases.json      # here: cases + predictions
    python3 benchmarks/gpu_stage_check.py measure cases.json -o measured.json  # on the GPU machine
    python benchmarks/gpu_stage_check.py compare measured.json              # here: the table

One H200 run is kept in benchmarks/measured/qwen2.5-32b_pp4_stage_h200.json (its cases file
beside it); `compare` on it prints the table in docs/CALIBRATION.md.

What is measured: PyTorch eager (no CUDA graphs; wall time of a stage's whole pass after
synchronising, so launch overhead counts as it does in an eager engine), GEMMs through
cuBLAS, attention through ``scaled_dot_product_attention`` (FlashAttention for prefill
without past; a masked kernel for a chunk with past; decode over a padded batch of equal
contexts), RoPE omitted (elementwise, small), RMSNorm as two reductions. A real engine
(SGLang, vLLM) fuses more and replays decode steps as CUDA graphs, so its times sit at or
below these; the comparison says how far the model's GPU side is from a plain implementation
on the same chip, not from SGLang.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

MODEL = "Qwen2.5-32B"
PP = 4
STAGE = 1  # a middle stage: decoder layers only

# (name, prefill chunk, its past, number of decodes, each decode's context)
CASES: list[tuple[str, int, int, int, int]] = [
    ("prefill 128", 128, 0, 0, 0),
    ("prefill 256", 256, 0, 0, 0),
    ("prefill 512", 512, 0, 0, 0),
    ("prefill 1024", 1024, 0, 0, 0),
    ("prefill 2048", 2048, 0, 0, 0),
    ("prefill 4096", 4096, 0, 0, 0),
    ("chunk 512 after 4096", 512, 4096, 0, 0),
    ("chunk 1024 after 8192", 1024, 8192, 0, 0),
    ("decode 8 x 1024", 0, 0, 8, 1024),
    ("decode 32 x 1024", 0, 0, 32, 1024),
    ("decode 64 x 2048", 0, 0, 64, 2048),
    ("decode 128 x 2048", 0, 0, 128, 2048),
    ("decode 256 x 1024", 0, 0, 256, 1024),
    ("chunk 256 + 32 decodes x 2048", 256, 0, 32, 2048),
    ("chunk 512 after 2048 + 64 decodes x 1024", 512, 2048, 64, 1024),
]


def plan(gpu: str, out: Path) -> None:
    from fastpp.sim.analytic import analytic_profile

    profile = analytic_profile(MODEL, gpu, PP, 1)
    stage = profile.stages[STAGE]
    m = profile.model
    cases = []
    for name, chunk, past, num_dec, ctx in CASES:
        num_tokens = chunk + num_dec
        predicted = stage.time_s(num_tokens, 0, chunk * past, chunk * chunk, num_dec * ctx)
        cases.append(
            {
                "name": name,
                "chunk": chunk,
                "past": past,
                "num_decodes": num_dec,
                "context": ctx,
                "predicted_s": predicted,
            }
        )
    shape = {
        "hidden": m.hidden_size,
        "heads": m.num_heads,
        "kv_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "intermediate": m.intermediate_size,
        "qkv_bias": m.qkv_bias,
        "layers": stage.num_layers,
    }
    out.write_text(
        json.dumps(
            {"model": MODEL, "gpu": gpu, "pp": PP, "stage": STAGE, "shape": shape, "cases": cases}, indent=1
        )
    )
    print(f"wrote {out}: {len(cases)} cases, {stage.num_layers} layers of {MODEL} on {gpu} (analytic)")


def measure(cases_path: Path, out: Path, repeats: int) -> None:
    import torch
    import torch.nn.functional as F

    spec = json.loads(cases_path.read_text())
    s = spec["shape"]
    h, nh, nkv, hd = s["hidden"], s["heads"], s["kv_heads"], s["head_dim"]
    inter, layers = s["intermediate"], s["layers"]
    # on a machine without a GPU (a dry run of this script) the same code runs on the CPU
    dev, dt = ("cuda" if torch.cuda.is_available() else "cpu"), torch.bfloat16
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    torch.manual_seed(0)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dt) * 0.02

    weights = [
        dict(
            qkv=w(h, (nh + 2 * nkv) * hd),
            qkv_b=w((nh + 2 * nkv) * hd),
            o=w(nh * hd, h),
            gate_up=w(h, 2 * inter),
            down=w(inter, h),
            n1=torch.ones(h, device=dev, dtype=dt),
            n2=torch.ones(h, device=dev, dtype=dt),
        )
        for _ in range(layers)
    ]

    def rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * g

    def stage_fn(case: dict):
        chunk, past, nd, ctx = case["chunk"], case["past"], case["num_decodes"], case["context"]
        x0 = torch.randn(chunk + nd, h, device=dev, dtype=dt)
        # per layer: the chunk's past K/V and the decodes' K/V caches
        kv_past = [torch.randn(2, 1, nkv, past, hd, device=dev, dtype=dt) for _ in weights] if past else None
        kv_dec = [torch.randn(2, nd, nkv, ctx, hd, device=dev, dtype=dt) for _ in weights] if nd else None
        mask = None
        if chunk and past:  # chunk row i sees the whole past and its own first i+1 tokens
            mask = torch.ones(chunk, past + chunk, device=dev, dtype=torch.bool).tril(diagonal=past)

        def run() -> torch.Tensor:
            x = x0
            for li, lw in enumerate(weights):
                y = rms(x, lw["n1"])
                qkv = torch.addmm(lw["qkv_b"], y, lw["qkv"])
                q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
                outs = []
                if chunk:
                    qp = q[:chunk].view(1, chunk, nh, hd).transpose(1, 2)
                    kp = k[:chunk].view(1, chunk, nkv, hd).transpose(1, 2)
                    vp = v[:chunk].view(1, chunk, nkv, hd).transpose(1, 2)
                    if past:
                        kp = torch.cat([kv_past[li][0], kp], dim=2)
                        vp = torch.cat([kv_past[li][1], vp], dim=2)
                        a = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, enable_gqa=True)
                    else:
                        a = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
                    outs.append(a.transpose(1, 2).reshape(chunk, nh * hd))
                if nd:
                    qd = q[chunk:].view(nd, 1, nh, hd).transpose(1, 2)
                    kd = kv_dec[li][0]
                    vd = kv_dec[li][1]
                    a = F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True)
                    outs.append(a.transpose(1, 2).reshape(nd, nh * hd))
                attn = outs[0] if len(outs) == 1 else torch.cat(outs)
                x = x + attn @ lw["o"]
                y = rms(x, lw["n2"])
                gu = y @ lw["gate_up"]
                g, u = gu.split(inter, dim=-1)
                x = x + (F.silu(g) * u) @ lw["down"]
            return x

        return run

    results = []
    for case in spec["cases"]:
        with torch.inference_mode():
            run = stage_fn(case)
            for _ in range(3):
                run()
            sync()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                run()
                sync()
                times.append(time.perf_counter() - t0)
            graph_s = None
            if dev == "cuda":  # the same pass replayed as one CUDA graph: no launch overhead
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    run()
                graph.replay()
                sync()
                graph_times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    graph.replay()
                    sync()
                    graph_times.append(time.perf_counter() - t0)
                graph_s = statistics.median(graph_times)
                del graph
        results.append(
            {
                **case,
                "measured_s": statistics.median(times),
                "measured_min_s": min(times),
                "graph_s": graph_s,
                "repeats": repeats,
            }
        )
        print(
            f"{case['name']:42s} eager {statistics.median(times) * 1e3:8.2f} ms   graph "
            f"{(graph_s or 0) * 1e3:8.2f} ms   model {case['predicted_s'] * 1e3:8.2f} ms",
            flush=True,
        )
        del run
        if dev == "cuda":
            torch.cuda.empty_cache()
    device = {
        "name": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    out.write_text(json.dumps({**spec, "device": device, "cases": results}, indent=1))


def compare(measured_path: Path) -> None:
    data = json.loads(measured_path.read_text())
    dev = data.get("device", {})
    print(
        f"{data['model']}, one stage of PP={data['pp']} ({data['shape']['layers']} layers), BF16; "
        f"model: analytic {data['gpu']}; measured: {dev.get('name')} (torch {dev.get('torch')}, "
        f"eager, median of {data['cases'][0]['repeats']})"
    )
    print()
    graphs = all(c.get("graph_s") for c in data["cases"])
    print(
        "| microbatch | eager (ms) |"
        + (" CUDA graph (ms) |" if graphs else "")
        + " analytic model (ms) | model / eager |"
        + (" model / graph |" if graphs else "")
    )
    print("|---" * (6 if graphs else 4) + "|")
    columns = {"eager": "measured_s", "graph": "graph_s"} if graphs else {"eager": "measured_s"}
    ratios: dict[str, list[float]] = {k: [] for k in columns}
    for c in data["cases"]:
        for k, key in columns.items():
            ratios[k].append(c["predicted_s"] / c[key])
        cells = [f"{c[key] * 1e3:.2f}" for key in columns.values()] + [f"{c['predicted_s'] * 1e3:.2f}"]
        cells += [f"{ratios[k][-1]:.2f}" for k in columns]
        print(f"| {c['name']} | " + " | ".join(cells) + " |")
    print()
    for k, rs in ratios.items():
        error = statistics.median(abs(r - 1) for r in rs)
        print(
            f"against {k}: median |model / measured - 1| = {error:.1%}; "
            f"model / measured {min(rs):.2f} .. {max(rs):.2f}"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="cases and the analytic model's predictions (needs fastpp)")
    p.add_argument("--gpu", default="H200", help="GPU name in fastpp's catalog [default: H200]")
    p.add_argument("-o", "--out", type=Path, default=Path("gpu_stage_cases.json"))
    m = sub.add_parser("measure", help="time the cases on this machine's GPU (needs torch with CUDA)")
    m.add_argument("cases", type=Path)
    m.add_argument("-o", "--out", type=Path, default=Path("gpu_stage_measured.json"))
    m.add_argument("--repeats", type=int, default=10)
    c = sub.add_parser("compare", help="print measured vs predicted")
    c.add_argument("measured", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "plan":
        plan(args.gpu, args.out)
    elif args.cmd == "measure":
        measure(args.cases, args.out, args.repeats)
    else:
        compare(args.measured)


if __name__ == "__main__":
    sys.exit(main())
