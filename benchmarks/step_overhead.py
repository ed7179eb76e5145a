"""What a hand-written decode step would save: HF's Llama step against a minimal one.

Both run the same modules of a SmolLM2-135M-shaped ``LlamaForCausalLM`` (random weights, the
linears on packed weights as in sampling, :mod:`llm_marl.policies.packed_weights`) over the
same KV cache (:func:`llm_marl.policies.sampling.prefill`, room reserved) and feed the same
tokens. The minimal step keeps only what a step must do: embed, then per layer the norm, the
q/k/v projections, rotary embedding, one in-place cache write, one SDPA call over the filled
cache (GQA by ``enable_gqa``), the output projection, the MLP; no ``Cache`` object, no mask
building, no keyword plumbing. Printed: ms per step of each, and of the step's linears alone
(the packed kernels over the same weights), fastest of ``--repeats``, one torch thread. The
difference between HF's step and the minimal one bounds what rewriting the model's forward for
decoding can save; the difference between the minimal step and the linears is the small ops
(norms, rotary, attention, cache) that any step pays. Usage::

    python benchmarks/step_overhead.py                    # fp32 and bf16, 4 and 8 rows
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import print_machine  # noqa: E402
from decode import fastest  # noqa: E402
from throughput import SMOLLM2_135M  # noqa: E402

PROMPT, STEPS = 32, 24


def minimal_loop(model, cache, tokens, mask):
    """Logits of each step, fed ``tokens[step]``, on the room-reserved ``cache``."""
    import torch
    import torch.nn.functional as F
    from transformers.models.llama.modeling_llama import rotate_half

    inner, rows = model.model, tokens.shape[1]
    rooms = []
    for layer in cache.layers:  # the buffers sampling.repeat_with_room reserved
        cells = dict(zip(layer.update.__code__.co_freevars, (c.cell_contents for c in layer.update.__closure__)))
        rooms.append((cells["key_room"], cells["value_room"]))
    filled = cache.layers[0].keys.shape[-2]
    keep = torch.zeros(rows, 1, 1, rooms[0][0].shape[-2], dtype=torch.bool)
    keep[:, 0, 0, :filled] = mask.repeat_interleave(rows // mask.shape[0], 0).bool()
    position = keep[:, 0, 0].sum(-1, keepdim=True)
    head_dim, scale = inner.layers[0].self_attn.head_dim, inner.layers[0].self_attn.scaling
    out = []
    for token in tokens:
        keep[:, 0, 0, filled] = True
        h = inner.embed_tokens(token[:, None])
        cos, sin = (t.unsqueeze(1) for t in inner.rotary_emb(h, position))
        for layer, (key_room, value_room) in zip(inner.layers, rooms):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q, k, v = (proj(x).view(rows, 1, -1, head_dim).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            key_room[:, :, filled], value_room[:, :, filled] = k[:, :, 0], v[:, :, 0]
            o = F.scaled_dot_product_attention(q, key_room[:, :, : filled + 1], value_room[:, :, : filled + 1],
                                               attn_mask=keep[..., : filled + 1], scale=scale, enable_gqa=True)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(rows, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        out.append(model.lm_head(inner.norm(h))[:, -1])
        filled, position = filled + 1, position + 1
    return torch.stack(out)


def hf_loop(model, cache, tokens, mask):
    import torch

    rows = tokens.shape[1]
    mask = mask.repeat_interleave(rows // mask.shape[0], 0)
    position = mask.sum(-1, keepdim=True)
    out = []
    for token in tokens:
        mask = torch.cat([mask, mask.new_ones((rows, 1))], 1)
        result = model(input_ids=token[:, None], attention_mask=mask, cache=cache, use_cache=True, position_ids=position)
        cache, position = result.cache, position + 1
        out.append(result.logits[:, -1])
    return torch.stack(out)


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from llm_marl.policies import sampling
    from llm_marl.policies.lm_runner import ModelRunner
    from llm_marl.policies.packed_weights import packed_linears

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args(argv)
    print_machine()
    torch.set_num_threads(1)

    print("| dtype | rows | HF step ms | minimal step ms | its linears ms | max |logit diff| |\n|---|---|---|---|---|---|")
    for name in opts.dtypes:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M, pad_token_id=0)).to(getattr(torch, name)).eval().requires_grad_(False)
        runner = ModelRunner(model)
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        for rows in opts.rows:
            ids = torch.randint(1, SMOLLM2_135M["vocab_size"], (rows // 4, PROMPT))
            mask = torch.ones_like(ids)
            ids[:, :3], mask[:, :3] = 0, 0  # some left padding
            tokens = torch.randint(1, SMOLLM2_135M["vocab_size"], (STEPS, rows))
            inputs = {w: torch.randn(rows, 1, w, dtype=model.dtype) for w in {m.in_features for m in linears}}

            def prefill():
                return sampling.prefill(runner, ids, mask, 4, STEPS)[1]

            with torch.inference_mode(), packed_linears(model).active(rows, STEPS):
                hf, lean = hf_loop(model, prefill(), tokens, mask), minimal_loop(model, prefill(), tokens, mask)
                diff = (hf.float() - lean.float()).abs().max().item()
                base = fastest(prefill, opts.repeats)
                t_hf = (fastest(lambda: hf_loop(model, prefill(), tokens, mask), opts.repeats) - base) / STEPS
                t_min = (fastest(lambda: minimal_loop(model, prefill(), tokens, mask), opts.repeats) - base) / STEPS
                t_lin = fastest(lambda: [m(inputs[m.in_features]) for m in linears], opts.repeats)
            print(f"| {name} | {rows} | {t_hf * 1e3:.1f} | {t_min * 1e3:.1f} | {t_lin * 1e3:.1f} | {diff:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
