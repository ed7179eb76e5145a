"""Decoding speed of llm_marl's sampler at a real model's shape, against its two floors.

The model: the SmolLM2-135M shape (``throughput.SMOLLM2_135M``: Llama, 30 layers, hidden 576,
intermediate 1536, 9 heads / 3 KV heads, vocab 49,152, tied embeddings) with random weights (seed
0), in fp32 and bf16, sampled through :class:`llm_marl.policies.CausalLMPolicy` (its own decode
loop, the path training uses) with the tiny model's tokenizer padded to 49,152 ids. Rows are
prompts x K answers (K = 4, one prompt's answers for 4 rows, more prompts for 8/16/32 rows),
prompts of ``--prompt-tokens`` tokens, temperature 1, no top-p/top-k, eos suppressed
(``min_new_tokens = max_new_tokens``) so that every row decodes every step.

Per (dtype, rows):

- **ms per token step**: (time of ``sample`` with ``--steps`` new tokens − time with 1 new
  token) / (steps − 1), each the fastest of ``--repeats`` calls: prefill and set-up cancel out.
- **weight-streaming floor**: the time to read every weight once — measured as the fastest
  ``dst.copy_(src)`` of a tensor of the weights' byte count (the bandwidth a copy reaches here);
  a decode step cannot be faster while the weights do not fit in cache.
- **compute floor**: the step's matmul FLOPs (2 x rows x every linear weight incl. the tied lm
  head, plus attention over the average context) at the FLOP/s a large square matmul of that
  dtype reaches here; and the **achieved FLOP/s** of the step.

Both floors are measured in the same run, with the same torch thread count (``--threads``,
default 1, as ``throughput.py``). Usage::

    python benchmarks/decode.py                           # fp32 and bf16, 4/8/16/32 rows
    python benchmarks/decode.py --dtypes float32 --rows 4 --steps 8 --repeats 1   # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import SMOLLM2_135M, SMALL, padded_tokenizer, smol_model  # noqa: E402

K = 4


def fastest(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def copy_seconds(num_bytes: int, repeats: int) -> float:
    """The fastest copy of a ``num_bytes`` tensor into another (both allocated and touched first)."""
    import torch

    src = torch.ones(num_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = fastest(lambda: dst.copy_(src), max(3, repeats))
    del src, dst
    return seconds


def matmul_flops_per_second(dtype, repeats: int, size: int = 1024) -> float:
    """FLOP/s of the fastest ``size`` x ``size`` matmul in ``dtype``."""
    import torch

    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    a @ b
    return 2 * size**3 / fastest(lambda: a @ b, max(3, repeats))


def step_flops(model, rows: int, context: float) -> float:
    """Matmul FLOPs of one decode step of ``rows`` rows at ``context`` tokens of context."""
    import torch

    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 4 * config.num_hidden_layers * config.num_attention_heads * head_dim * context  # QK^T and AV
    return rows * (2 * linear + attention)


def weight_bytes(model) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:  # the tied lm head is the embedding: read once
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def prompts_of(tokenizer, count: int, tokens: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    vocab = len(tokenizer)
    return ["".join(tokenizer.convert_ids_to_tokens([rng.randrange(1000, vocab) for _ in range(tokens)])) for _ in range(count)]


def run(opts) -> list[dict]:
    import torch

    torch.set_num_threads(opts.threads)
    from llm_marl.policies.causal_lm import CausalLMPolicy
    from llm_marl.policies.tiny import build_tiny_model

    folder = build_tiny_model(os.path.join(opts.model_dir, "small"), pretrain_steps=60, **SMALL)
    tokenizer = padded_tokenizer(str(folder), SMOLLM2_135M["vocab_size"])
    results = []
    for dtype_name in opts.dtypes:
        dtype = getattr(torch, dtype_name)
        model = smol_model(tokenizer, dtype_name)
        size = weight_bytes(model)
        stream = copy_seconds(size, opts.repeats)
        peak = matmul_flops_per_second(dtype, opts.repeats)
        print(f"# {dtype_name}: weights {size / 1e6:.0f} MB; a copy of that many bytes {stream * 1e3:.1f} ms "
              f"({size / stream / 1e9:.1f} GB/s); 1024^3 matmul {peak / 1e9:.1f} GFLOP/s; threads {opts.threads}", flush=True)
        for rows in opts.rows:
            prompts = prompts_of(tokenizer, max(1, rows // K), opts.prompt_tokens, seed=rows)
            k = rows // len(prompts)

            def policy(steps):
                return CausalLMPolicy(model, tokenizer, max_new_tokens=steps, min_new_tokens=steps, temperature=1.0,
                                      top_p=None, top_k=None)

            full, one = policy(opts.steps), policy(1)
            with torch.no_grad():
                one.sample(prompts, k)  # warm-up
                t_one = fastest(lambda: one.sample(prompts, k), opts.repeats)
                t_full = fastest(lambda: full.sample(prompts, k), opts.repeats)
            per_step = (t_full - t_one) / (opts.steps - 1)
            flops = step_flops(model, rows, opts.prompt_tokens + opts.steps / 2)
            row = {
                "dtype": dtype_name, "rows": rows, "prompts": len(prompts), "k": k, "steps": opts.steps,
                "ms_per_step": per_step * 1e3, "stream_floor_ms": stream * 1e3, "ratio_to_stream_floor": per_step / stream,
                "compute_floor_ms": flops / peak * 1e3, "achieved_gflops": flops / per_step / 1e9, "peak_gflops": peak / 1e9,
                "weight_mb": size / 1e6, "threads": opts.threads, "load1": os.getloadavg()[0],
            }
            results.append(row)
            print(f"{dtype_name:>9} rows {rows:>3} ({len(prompts)} x {k}) steps {opts.steps}: {row['ms_per_step']:7.1f} ms/step | "
                  f"stream floor {row['stream_floor_ms']:6.1f} ms (x{row['ratio_to_stream_floor']:.2f}) | "
                  f"compute floor {row['compute_floor_ms']:6.1f} ms | achieved {row['achieved_gflops']:5.1f} of "
                  f"{row['peak_gflops']:.1f} GFLOP/s | load {row['load1']:.1f}", flush=True)
        del model
    return results


def table(results: list[dict]) -> str:
    lines = ["| dtype | rows | steps | ms per step | weight-streaming floor ms | ratio | compute floor ms | achieved GFLOP/s | matmul peak GFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['dtype']} | {r['rows']} | {r['steps']} | {r['ms_per_step']:.1f} | {r['stream_floor_ms']:.1f} | "
                     f"{r['ratio_to_stream_floor']:.2f}x | {r['compute_floor_ms']:.1f} | {r['achieved_gflops']:.1f} | {r['peak_gflops']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16, 32], help="rows (prompts x 4 answers); default 4 8 16 32")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--steps", type=int, default=24, help="new tokens per answer (default 24)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="tokens per prompt (default 32)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="calls per measurement; the fastest counts (default 3)")
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "llm_marl_bench_models"),
                        help="cache of the tiny model whose tokenizer is used (shared with throughput.py)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    opts = parser.parse_args(argv)
    if opts.steps < 2:
        parser.error("--steps must be >= 2 (a step's time is the difference to a 1-token call)")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    results = run(opts)
    print()
    print(table(results))
    if opts.out:
        with open(opts.out, "w") as handle:
            json.dump({"options": vars(opts), "rows": results, "table": table(results)}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
