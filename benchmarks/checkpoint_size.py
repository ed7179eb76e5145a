"""Bytes on disk of one agent's share of a checkpoint, measured by writing real checkpoints.

For each shape (the tiny 2-layer 128-wide GPT-2 of ``llm_marl.policies.tiny``, and the
SmolLM2-135M shape — Llama, 30 layers, hidden 576, intermediate 1536, 9 heads / 3 KV heads,
vocab 49,152, tied embeddings — with random weights in fp32) and each kind of agent (a full model,
or a LoRA adapter of rank 8 on one frozen base, peft's default target modules), a two-agent
MAGRPO trainer trains one optimizer step and writes its closing checkpoint; the script prints the
size of ``agent_0/policy.pt`` (weights), ``agent_0/optimizer.pt`` (AdamW's two moments and step)
and the whole checkpoint (both agents, RNG states, buffers, manifest).

Usage::

    python benchmarks/checkpoint_size.py            # tiny and SmolLM2-135M shapes
    python benchmarks/checkpoint_size.py --tiny     # the tiny shape only (seconds)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import print_machine  # noqa: E402

SMOLLM2_135M = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0, tie_word_embeddings=True,
    bos_token_id=1, eos_token_id=2, pad_token_id=2,
)


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def measure(model, tokenizer, lora_r: int | None, work: str) -> dict[str, int]:
    import copy
    import shutil

    from llm_marl import MAGRPOConfig, MAGRPOTrainer
    from llm_marl.envs.dialogue import DialogueEnv
    from llm_marl.policies.causal_lm import CausalLMPolicy
    from llm_marl.policies.lora_team import LoRATeam
    from llm_marl.tasks.function_task import FunctionTask

    settings = dict(max_new_tokens=2, temperature=1.0, top_p=1.0, top_k=None)
    if lora_r is None:
        policies = [CausalLMPolicy(copy.deepcopy(model), tokenizer, **settings) for _ in range(2)]
    else:
        policies = list(LoRATeam.from_model(model, tokenizer, ["agent_0", "agent_1"], r=lora_r, **settings).policies.values())
    task = FunctionTask(lambda a, b: [float(len(a[0]))], lambda item: item["prompt"], None,
                        [{"prompt": "The import statement"}], num_agents=2, num_turns=1)
    out = tempfile.mkdtemp(prefix="run-", dir=work)
    args = MAGRPOConfig(num_agents=2, num_turns=1, num_train_epochs=1, num_generations=2, rollout_buffer_size=2,
                        eval_interval=0, progress_bar=False, rollout_log_steps=0, early_termination_threshold=None,
                        output_dir=out, save_final_checkpoint=True, **settings)
    trainer = MAGRPOTrainer(env=DialogueEnv(task), policies=policies, args=args)
    trainer.train()
    path = trainer.state.last_checkpoint
    sizes = {
        "weights": _size(os.path.join(path, "agent_0", "policy.pt")),
        "optimizer": _size(os.path.join(path, "agent_0", "optimizer.pt")),
        "parameters": sum(p.numel() for p in trainer.trainable["agent_0"]),
        "checkpoint": _size(path),
    }
    shutil.rmtree(out)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="only the tiny shape")
    ns = parser.parse_args()
    print_machine()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from llm_marl.policies.tiny import build_tiny_model

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as work:
        folder = build_tiny_model(os.path.join(work, "tiny"), pretrain_steps=0)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        shapes = [("tiny GPT-2 (2x128)", lambda: AutoModelForCausalLM.from_pretrained(folder))]
        if not ns.tiny:
            shapes.append(("SmolLM2-135M shape", lambda: LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).float()))
        print(f"{'shape':20} {'agent':10} {'trainable params':>16} {'weights':>12} {'optimizer':>12} {'per agent':>12} {'checkpoint (2 agents)':>22}")
        for name, build in shapes:
            for lora_r in (None, 8):
                sizes = measure(build(), tokenizer, lora_r, work)
                agent = "full" if lora_r is None else f"LoRA r={lora_r}"
                per_agent = sizes["weights"] + sizes["optimizer"]
                print(f"{name:20} {agent:10} {sizes['parameters']:>16,} {sizes['weights']:>12,} {sizes['optimizer']:>12,} "
                      f"{per_agent:>12,} {sizes['checkpoint']:>22,}", flush=True)


if __name__ == "__main__":
    main()
