"""The linear layers of one decode step, plain against packed weights (``llm_marl.policies.packed_weights``).

For a model shape (the 7 projections of each of its layers and the lm head, random weights,
streamed from memory as in a real step), per dtype and row count: the time of every linear of
one step through ``F.linear``, through the packed kernel ``packed_weights`` uses for that dtype
(MKL's packed sgemm for fp32, packed for exactly that row count; oneDNN's prepacked weight for
bf16), the same with each layer's q/k/v and gate/up weights packed as one matrix ("fused": three
and two calls become one each), and the time to pack every weight once; against the **read
floor**, the fastest read of the same bytes (``decode.read_seconds``), so the last column says
how far the kernel is from streaming the weights. Fastest of ``--repeats``, one torch thread by
default. Usage::

    python benchmarks/packed_linears.py                       # SmolLM2-135M shape, fp32 and bf16
    python benchmarks/packed_linears.py --shape qwen0.5b --dtypes float32
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import print_machine  # noqa: E402
from decode import fastest, read_seconds  # noqa: E402

SHAPES = {
    # hidden, intermediate, kv width (kv heads x head dim), layers, vocabulary
    "smol135m": (576, 1536, 192, 30, 49152),
    "qwen0.5b": (896, 4864, 128, 24, 151936),
}


def step_weights(shape: str, dtype):
    import torch

    hidden, inter, kv, layers, vocab = SHAPES[shape]
    per_layer = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (inter, hidden), (inter, hidden), (hidden, inter)]
    weights = [torch.randn(*s, dtype=dtype) for _ in range(layers) for s in per_layer]
    return weights + [torch.randn(vocab, hidden, dtype=dtype)]


def fused(weights: list, layers: int) -> list:
    """``step_weights`` with each layer's q, k, v stacked into one matrix and gate, up into one."""
    import torch

    out = []
    for layer in range(layers):
        q, k, v, o, gate, up, down = weights[7 * layer : 7 * layer + 7]
        out += [torch.cat([q, k, v]), o, torch.cat([gate, up]), down]
    return out + weights[7 * layers :]


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.nn.functional as F

    from llm_marl.cpu import bf16_support
    from llm_marl.policies.packed_weights import KERNELS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smol135m")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=4)
    opts = parser.parse_args(argv)
    print_machine()
    torch.set_num_threads(opts.threads)
    print("| shape | dtype | rows | F.linear ms | packed ms | speed-up | packed, fused ms | packing ms | read floor ms | packed / floor |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    for name in opts.dtypes:
        dtype = getattr(torch, name)
        if dtype == torch.bfloat16 and not bf16_support().runs:
            print(f"packed_linears.py: bfloat16 skipped: no packed bf16 kernels here ({bf16_support().reason})")
            continue
        kernel = KERNELS[dtype]
        weights = step_weights(opts.shape, dtype)
        stacked = fused(weights, SHAPES[opts.shape][3])
        floor, _ = read_seconds(sum(w.numel() * w.element_size() for w in weights), opts.repeats)
        with torch.inference_mode():
            for rows in opts.rows:
                inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=dtype) for w in weights}
                [F.linear(inputs[w.shape[1]], w) for w in weights]  # warm-up
                plain = fastest(lambda: [F.linear(inputs[w.shape[1]], w) for w in weights], opts.repeats)
                times = []
                for group in (weights, stacked):
                    start = time.perf_counter()
                    packs = [kernel.pack(w, rows) for w in group]
                    times.append(time.perf_counter() - start)
                    [kernel.run(inputs[w.shape[1]], p, w, None, rows) for w, p in zip(group, packs)]  # warm-up
                    times.append(fastest(lambda: [kernel.run(inputs[w.shape[1]], p, w, None, rows) for w, p in zip(group, packs)],
                                         opts.repeats))
                    packs.clear()
                packing, packed, _, packed_fused = times
                print(f"| {opts.shape} | {name} | {rows} | {plain * 1e3:.1f} | {packed * 1e3:.1f} | {plain / packed:.2f}x | "
                      f"{packed_fused * 1e3:.1f} | {packing * 1e3:.0f} | {floor * 1e3:.1f} | {packed / floor:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
