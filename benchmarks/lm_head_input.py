"""The lm head on HF's sliced hidden states, as they are and as a fresh tensor.

``logits_to_keep`` makes HF models slice the hidden states (``h[:, -k:, :]``) before the lm
head. On a CPU, torch runs a 3-D input with such strides as a batched matmul with the weight
expanded and copied per batch row; :func:`llm_marl.policies.lm_runner.dense_head_inputs` hands the
head a fresh tensor instead (a copy of the same values). Measured, one torch thread, fastest of
``--repeats``:

1. **the head alone** (SmolLM2-135M's, 49,152 x 576): ``F.linear`` on the last position of
   ``rows`` prompts of 32 tokens, strided and fresh, without gradients and forward + backward;
2. **a team's scoring pass** (an adapter team of rank 8 on random weights of the SmolLM2-135M
   shape, two agents, 2 prompts of 32 tokens x 4 answers of 24 tokens: the prompt pass, whose head
   input is sliced, and the answer pass), forward and backward, with the fp32 base and with a bf16
   base (``LoRATeam(dtype="bfloat16")``), hook on and off.

Sampling with packed weights (the default) is not in the table: the packed kernels take strided
inputs at full speed (bf16 prefill: 2.6 ms strided, 2.2 ms fresh), but an fp32 prefill, whose row
count is not the pack's, runs ``F.linear``. Usage::

    python benchmarks/lm_head_input.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import print_machine  # noqa: E402
from decode import fastest  # noqa: E402
from throughput import SMALL, SMOLLM2_135M, padded_tokenizer, smol_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.nn.functional as F

    import llm_marl.policies.lm_runner as lm_runner
    from llm_marl.policies import scoring
    from llm_marl.policies.lora_team import LoRATeam
    from llm_marl.policies.tiny import build_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model-dir", default="/tmp/llm_marl_bench_models")
    opts = parser.parse_args(argv)
    print_machine()
    torch.set_num_threads(1)

    print("| dtype | rows | no grad, strided ms | no grad, fresh ms | fwd+bwd, strided ms | fwd+bwd, fresh ms |\n|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.randn(SMOLLM2_135M["vocab_size"], SMOLLM2_135M["hidden_size"]).to(dtype)
        for rows in (1, 2, 8):
            hidden = torch.randn(rows, 32, weight.shape[1]).to(dtype).requires_grad_(True)
            cells = []
            for grad in (False, True):
                for fresh in (False, True):
                    def run(grad=grad, fresh=fresh):
                        with torch.set_grad_enabled(grad):
                            last = hidden[:, -1:, :]
                            out = F.linear(last.contiguous().view(last.shape) if fresh else last, weight)
                            if grad:
                                out.float().sum().backward()
                    cells.append(fastest(run, opts.repeats) * 1e3)
            print(f"| {str(dtype).split('.')[-1]} | {rows} | " + " | ".join(f"{c:.1f}" for c in cells) + " |", flush=True)

    folder = build_tiny_model(os.path.join(opts.model_dir, "small"), pretrain_steps=60, **SMALL)
    tokenizer = padded_tokenizer(str(folder), SMOLLM2_135M["vocab_size"])
    torch.manual_seed(0)
    prompts = [list(range(1000, 1032))] * 4 + [list(range(2000, 2032))] * 4
    answers = [torch.randint(100, 40000, (24,)).tolist() for _ in range(8)]
    routes = ["a"] * 4 + ["b"] * 4
    print("\n| base | hook | scoring forward s | backward s |\n|---|---|---|---|")
    for dtype in ("float32", "bfloat16"):
        for hook in (True, False):
            install = lm_runner.dense_head_inputs
            if not hook:
                lm_runner.dense_head_inputs = lambda model: False
            try:
                team = LoRATeam.from_model(smol_model(tokenizer, dtype), tokenizer, ("a", "b"), r=8)
            finally:
                lm_runner.dense_head_inputs = install
            team.model.train()
            forward, backward = [], []
            for _ in range(opts.repeats + 1):  # the first is a warm-up
                start = time.perf_counter()
                values, _ = scoring.token_log_probs(team.runner, prompts, answers, pad_token_id=0, temperature=1.0, routes=routes)
                middle = time.perf_counter()
                values.sum().backward()
                forward.append(middle - start)
                backward.append(time.perf_counter() - middle)
            print(f"| {dtype} | {'on' if hook else 'off'} | {min(forward[1:]):.3f} | {min(backward[1:]):.3f} |", flush=True)
            del team
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
