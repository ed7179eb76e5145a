"""Decoding speed of llm_marl's sampler at a real model's shape, against its two floors.

The model: the SmolLM2-135M shape (``throughput.SMOLLM2_135M``: Llama, 30 layers, hidden 576,
intermediate 1536, 9 heads / 3 KV heads, vocab 49,152, tied embeddings) with random weights (seed
0), in fp32 and bf16, sampled through :class:`llm_marl.policies.CausalLMPolicy` (its own decode
loop, the path training uses) with the tiny model's tokenizer padded to 49,152 ids. Rows are
prompts x K answers (K = 4, one prompt's answers for 4 rows, more prompts for 8/16/32 rows),
prompts of ``--prompt-tokens`` tokens, temperature 1, no top-p/top-k, eos suppressed
(``min_new_tokens = max_new_tokens``) so that every row decodes every step.

Per (dtype, rows):

- **ms per token step**: (time of ``sample`` with ``--steps`` new tokens − time with
  ``short_call(steps)`` = max(12, steps // 2) new tokens) / the difference in tokens, each the
  fastest of ``--repeats`` rounds: prefill, packing and set-up cancel out. (Until 2026-12-01 the
  shorter call had 1 token; with packed weights that call packs nothing and its prefill runs
  unpacked, which made the difference too small, most for bf16 at 16-32 rows.)
  A round measures every (variant, rows) once, so the variants compared run interleaved.
- **weight-streaming floor**: the time to read every weight once — measured as the fastest
  read of a tensor of the weights' byte count, by ``src.sum()`` or by a vector-matrix product
  over it (:func:`read_seconds`; the second streams faster here: 16.3 against 12.6 GB/s); a
  decode step cannot be faster while the weights do not fit in cache. (Earlier on 2026-12-01
  this was ``src.sum()`` alone, about 30% slower than the fastest read, and before that the time
  of ``dst.copy_(src)``, which reads *and writes* the bytes: the ratios to both were flattered.)
- **compute floor**: the step's matmul FLOPs (2 x rows x every linear weight incl. the tied lm
  head, plus attention over the average context) at the FLOP/s a large square matmul of that
  dtype reaches here; and the **achieved FLOP/s** of the step.

- **packed weights**: every variant runs with ``CausalLMPolicy(packed_weights=True)`` (the
  default: linears on weights packed once, :mod:`llm_marl.policies.packed_weights`) and, labelled
  ``unpacked``, with ``packed_weights=False``. The models' weights are frozen here, so the packs
  are made in the warm-up and the step time is the steady state; **pack ms** is the time of
  packing every weight once for that row count, which a trainable model pays once per sampling
  call (after each optimizer step).

Both floors are measured in the same run, with the same torch thread count (``--threads``,
default 1, as ``throughput.py``).

Variants (``--dtypes``): ``float32`` and ``bfloat16`` (the model's weights in that dtype) and
``bf16-sampling`` (an fp32 model sampled through ``CausalLMPolicy(sample_dtype="bfloat16")``: a
bf16 copy decodes, the fp32 model scores; its floors are those of the bf16 weights). With
``--mismatch`` the sampled tokens' log-probs under the sampler itself (recorded at every decode
step, ``sampling.decode(on_step=)``, tempered and untruncated) are compared with the fp32
scorer's (``token_log_probs``, what the loss uses): mean and largest |difference| per token. For
``float32`` this is the kernel rounding between the incremental and the batched forward; the
``bfloat16`` variant has no fp32 scorer and is not compared. ``--model PATH`` runs a saved model
(e.g. the real SmolLM2-135M-Instruct under ``~/.cache/llm_marl/models/smollm2-135m``) with its
own tokenizer and chat template, on pydoc prompts, instead of the random-weight shape. Usage::

    python benchmarks/decode.py                           # fp32, bf16, bf16-sampling; 4/8/16/32 rows
    python benchmarks/decode.py --dtypes float32 --rows 4 --steps 8 --repeats 1   # seconds
    python benchmarks/decode.py --dtypes float32 bf16-sampling --mismatch --model ~/.cache/llm_marl/models/smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import print_machine  # noqa: E402
from throughput import SMOLLM2_135M, SMALL, bench_prompts, padded_tokenizer, smol_model  # noqa: E402

K = 4


def short_call(steps: int) -> int:
    """New tokens of the shorter call whose time is subtracted: half of ``steps``, but at least
    ``packed_weights.MIN_STEPS``, so that both calls pack their weights (and their prefills run
    alike); a 1-token call would not, and its unpacked prefill biased the difference."""
    from llm_marl.policies.packed_weights import MIN_STEPS

    return max(MIN_STEPS, steps // 2)


def fastest(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


READ_WIDTHS = (576, 1536, 4096)
"""Row widths of the vector-matrix products that read the buffer in :func:`read_seconds`."""


def read_seconds(num_bytes: int, repeats: int) -> tuple[float, str]:
    """The fastest read of a ``num_bytes`` fp32 tensor (allocated and touched first), and how:
    a sum over it, or a vector-matrix product ``u @ m`` over it viewed as ``[-1, width]`` for each
    width of :data:`READ_WIDTHS`. On this machine one thread reads 12.6 GB/s by ``sum`` and up to
    16.3 GB/s by ``u @ m`` (the GEMV streams with better prefetching), so the sum alone made the
    floor about 30% too slow (before 2026-12-01, fourth part)."""
    import torch

    src = torch.ones(num_bytes // 4, dtype=torch.float32)
    reads = {"sum": src.sum}
    for width in READ_WIDTHS:
        matrix = src[: src.numel() // width * width].view(-1, width)
        vector = torch.ones(matrix.shape[0])
        reads[f"vector @ [-1, {width}]"] = lambda matrix=matrix, vector=vector: vector @ matrix
    for read in reads.values():
        read()
    # A partial view reads slightly fewer bytes: scale its time up to the whole buffer.
    scale = {name: 1.0 for name in reads}
    for width in READ_WIDTHS:
        scale[f"vector @ [-1, {width}]"] = src.numel() / (src.numel() // width * width)
    timed = {name: fastest(read, max(3, repeats)) * scale[name] for name, read in reads.items()}
    del src
    how = min(timed, key=timed.get)
    return timed[how], how


def pack_seconds(model, rows: int) -> float:
    """Time to pack every packable weight of ``model`` once for calls of ``rows`` rows."""
    from llm_marl.policies.packed_weights import KERNELS, packed_linears

    layers = packed_linears(model).layers()
    start = time.perf_counter()
    for layer in layers:
        KERNELS[layer.weight.dtype].pack(layer.weight, rows)
    return time.perf_counter() - start


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


def mismatch(policy, prompts: list[str], k: int, seed: int) -> dict:
    """Mean and largest |sampler log-prob - fp32 scorer log-prob| over the sampled tokens of one
    ``sample``-like call (the sampler's own log-probs recorded at every decode step)."""
    import torch

    from llm_marl.policies import sampling

    recorded = []

    def on_step(logits, token):
        logp = torch.log_softmax(logits.float() / policy.temperature, dim=-1)
        recorded.append(logp.gather(-1, token.unsqueeze(-1)).squeeze(-1))

    torch.manual_seed(seed)
    encoded = policy.encode_prompts(prompts)
    with torch.inference_mode():
        input_ids, attention_mask = policy._left_pad(encoded)
        rows = sampling.decode(
            policy._sampling_runner(), input_ids, attention_mask, k,
            max_new_tokens=policy._max_new_tokens(input_ids.shape[1]), min_new_tokens=policy.min_new_tokens,
            room=policy.max_new_tokens, eos_token_ids=policy.eos_token_ids, pad_token_id=policy.pad_token_id,
            draw_token=policy._draw, on_step=on_step,
        )
    completions = policy._completions(rows)
    observations = [p for p in prompts for _ in range(k)]
    with torch.no_grad():
        scored, mask = policy.token_log_probs(observations, completions)
    sampler = torch.stack(recorded, dim=1)[:, : scored.shape[1]]
    diff = (sampler - scored).abs()[mask]
    return {"mean_abs_logprob_diff": float(diff.mean()), "max_abs_logprob_diff": float(diff.max()), "tokens": int(mask.sum()),
            "mean_logprob": float(scored[mask].mean())}


def run(opts) -> list[dict]:
    """Every (variant, rows) measured once per round, rounds repeated ``--repeats`` times, so the
    variants being compared run minutes apart at most; each cell keeps its fastest round."""
    import torch

    torch.set_num_threads(opts.threads)
    from llm_marl.policies.causal_lm import CausalLMPolicy
    from llm_marl.policies.tiny import build_tiny_model

    if opts.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(opts.model)
    else:
        folder = build_tiny_model(os.path.join(opts.model_dir, "small"), pretrain_steps=60, **SMALL)
        tokenizer = padded_tokenizer(str(folder), SMOLLM2_135M["vocab_size"])
    models, setups, copies = {}, {}, {}
    for variant in opts.dtypes:
        dtype_name = "float32" if variant == "bf16-sampling" else variant
        if dtype_name not in models:  # float32 and bf16-sampling share the fp32 model
            if opts.model:
                models[dtype_name] = AutoModelForCausalLM.from_pretrained(opts.model, dtype=getattr(torch, dtype_name))
            else:
                models[dtype_name] = smol_model(tokenizer, dtype_name)
        model = models[dtype_name].requires_grad_(False)  # frozen: packs made once (see the docstring)
        sample_dtype = "bfloat16" if variant == "bf16-sampling" else None
        floor_dtype = getattr(torch, sample_dtype or dtype_name)
        size = weight_bytes(model) * torch.empty(0, dtype=floor_dtype).element_size() // next(model.parameters()).element_size()
        stream, read_how = read_seconds(size, opts.repeats)
        peak = matmul_flops_per_second(floor_dtype, opts.repeats)
        print(f"# {variant}: weights read per step {size / 1e6:.0f} MB; a read of that many bytes {stream * 1e3:.1f} ms "
              f"({size / stream / 1e9:.1f} GB/s, by {read_how}); 1024^3 matmul {peak / 1e9:.1f} GFLOP/s; threads {opts.threads}", flush=True)
        for rows in opts.rows:
            count = max(1, rows // K)
            prompts = bench_prompts(count) if opts.model else prompts_of(tokenizer, count, opts.prompt_tokens, seed=rows)

            for packed in (True, False):

                def policy(steps, model=model, sample_dtype=sample_dtype, packed=packed):
                    return CausalLMPolicy(model, tokenizer, max_new_tokens=steps, min_new_tokens=steps, temperature=1.0,
                                          top_p=None, top_k=None, sample_dtype=sample_dtype, packed_weights=packed)

                full, one = policy(opts.steps), policy(short_call(opts.steps))
                full._shadow = one._shadow = copies.get(variant)  # one bf16 copy per variant (bf16-sampling)
                with torch.no_grad():
                    sampler = full._sampling_runner().model  # builds the copy outside the timing
                    copies[variant] = one._shadow = full._shadow
                    one.sample(prompts, rows // len(prompts))  # warm-up
                    full.sample(prompts, rows // len(prompts))  # warm-up; packs the (frozen) weights
                label = variant if packed else f"{variant} unpacked"
                setups[label, rows] = {"model": model, "prompts": prompts, "k": rows // len(prompts), "full": full, "one": one,
                                       "stream": stream, "read_how": read_how, "peak": peak, "t_one": [], "t_full": [], "loads": [],
                                       "pack_s": pack_seconds(sampler, rows) if packed else None}
    labels = [label for variant in opts.dtypes for label in (variant, f"{variant} unpacked")]
    for _ in range(opts.repeats):
        for rows in opts.rows:
            for variant in labels:
                setup = setups[variant, rows]
                with torch.no_grad():
                    setup["one"].sample(setup["prompts"], setup["k"])  # packs for these rows (fp32), untimed
                    setup["t_one"].append(fastest(lambda: setup["one"].sample(setup["prompts"], setup["k"]), 1))
                    setup["t_full"].append(fastest(lambda: setup["full"].sample(setup["prompts"], setup["k"]), 1))
                setup["loads"].append(os.getloadavg()[0])
    results = []
    for variant in labels:
        for rows in opts.rows:
            setup = setups[variant, rows]
            model, prompts, k, stream, peak = setup["model"], setup["prompts"], setup["k"], setup["stream"], setup["peak"]
            per_step = (min(setup["t_full"]) - min(setup["t_one"])) / (opts.steps - short_call(opts.steps))
            flops = step_flops(model, rows, opts.prompt_tokens + opts.steps / 2)
            row = {
                "dtype": variant, "rows": rows, "prompts": len(prompts), "k": k, "steps": opts.steps,
                "ms_per_step": per_step * 1e3, "stream_floor_ms": stream * 1e3, "ratio_to_stream_floor": per_step / stream,
                "stream_floor_read": setup["read_how"],
                "compute_floor_ms": flops / peak * 1e3, "achieved_gflops": flops / per_step / 1e9, "peak_gflops": peak / 1e9,
                "weight_mb": weight_bytes(model) / 1e6, "threads": opts.threads, "load1": max(setup["loads"]),
                "t_full_s": setup["t_full"], "t_one_s": setup["t_one"],
                "pack_ms": None if setup["pack_s"] is None else setup["pack_s"] * 1e3,
            }
            if opts.mismatch and not variant.startswith("bfloat16"):
                row.update(mismatch(setup["full"], prompts, k, seed=rows))
                print(f"# {variant} rows {rows}: mean |sampler - fp32 scorer| log-prob {row['mean_abs_logprob_diff']:.2e} per token "
                      f"(largest {row['max_abs_logprob_diff']:.2e}, {row['tokens']} tokens, mean log-prob {row['mean_logprob']:.2f})", flush=True)
            results.append(row)
            print(f"{variant:>13} rows {rows:>3} ({len(prompts)} x {k}) steps {opts.steps}: {row['ms_per_step']:7.1f} ms/step | "
                  f"stream floor {row['stream_floor_ms']:6.1f} ms (x{row['ratio_to_stream_floor']:.2f}) | "
                  f"compute floor {row['compute_floor_ms']:6.1f} ms | achieved {row['achieved_gflops']:5.1f} of "
                  f"{row['peak_gflops']:.1f} GFLOP/s | load <= {row['load1']:.1f}", flush=True)
    return results


def table(results: list[dict]) -> str:
    lines = ["| dtype | rows | steps | ms per step | weight-streaming floor ms | ratio | pack ms | compute floor ms | achieved GFLOP/s | matmul peak GFLOP/s | mean (max) abs log-prob diff, sampler vs fp32 scorer | max load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        diff = f"{r['mean_abs_logprob_diff']:.1e} ({r['max_abs_logprob_diff']:.1e})" if "mean_abs_logprob_diff" in r else "-"
        lines.append(f"| {r['dtype']} | {r['rows']} | {r['steps']} | {r['ms_per_step']:.1f} | {r['stream_floor_ms']:.1f} | "
                     f"{r['ratio_to_stream_floor']:.2f}x | {'-' if r['pack_ms'] is None else format(r['pack_ms'], '.0f')} | {r['compute_floor_ms']:.1f} | {r['achieved_gflops']:.1f} | {r['peak_gflops']:.1f} | "
                     f"{diff} | {r['load1']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16, 32], help="rows (prompts x 4 answers); default 4 8 16 32")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "bf16-sampling"],
                        choices=["float32", "bfloat16", "float16", "bf16-sampling"])
    parser.add_argument("--mismatch", action="store_true", help="also measure the sampler/scorer log-prob mismatch")
    parser.add_argument("--model", default=None, help="a saved model folder instead of the random-weight SmolLM2 shape")
    parser.add_argument("--steps", type=int, default=24, help="new tokens per answer (default 24)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="tokens per prompt (default 32)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each cell keeps its fastest (default 3)")
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "llm_marl_bench_models"),
                        help="cache of the tiny model whose tokenizer is used (shared with throughput.py)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    opts = parser.parse_args(argv)
    print_machine()
    if opts.steps <= short_call(opts.steps):
        parser.error(f"--steps must be > {short_call(opts.steps)} (a step's time is the difference to a shorter call "
                     f"that packs its weights too: at least MIN_STEPS = {short_call(0)} tokens)")
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
