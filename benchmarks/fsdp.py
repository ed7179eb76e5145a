"""Two SmolLM2-135M agents on 2 ranks: ``fsdp=True`` against plain data parallelism.

Workload: two full-model agents (``smollm2-135m``, fp32, fetched and converted on first use by
:mod:`llm_marl.policies.models`), MAGRPO, one turn, K=4 answers of exactly ``--new-tokens`` new
tokens (eos suppressed), prompts that open pydoc paragraphs, a length reward, ``--items`` items
in all (``items_per_step=1`` per rank, ``rollout_buffer_size=1``: one optimizer step per batch),
one epoch, no evaluation, no checkpoints. Each mode runs in its own ``torchrun --nproc_per_node
2`` launch (gloo on CPU, NCCL where CUDA is available), one thread per rank.

Measured per mode: seconds per item (wall time of ``trainer.train()`` / items, model loading
excluded), each rank's peak RSS (``ru_maxrss``; on CUDA also ``torch.cuda.max_memory_allocated``)
and the bytes each rank holds for parameters, gradients (at the last optimizer step) and AdamW
state, measured from the storages (:func:`llm_marl.runs.fsdp.local_nbytes`).

Usage::

    python benchmarks/fsdp.py --items 8 --out fsdp.json     # both modes, one after the other
    python benchmarks/fsdp.py --items 8 --layer             # and a third: fsdp_gather="layer"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def worker(args: argparse.Namespace) -> None:
    import resource

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from llm_marl.envs import DialogueEnv
    from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer
    from llm_marl.policies.causal_lm import CausalLMPolicy
    from llm_marl.runs.fsdp import local_nbytes
    from llm_marl.tasks.function_task import FunctionTask
    from llm_marl.tasks.writing.corpus import pydoc_paragraphs

    prompts = [" ".join(p.split()[:12]) for p in pydoc_paragraphs()[: args.items]]
    task = FunctionTask(lambda a, b: [float(len(a[0]) + len(b[0]))], lambda item: item["prompt"],
                        dataset=[{"prompt": p} for p in prompts], num_agents=2, num_turns=1)
    settings = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, temperature=1.0, top_p=None, top_k=None)
    policies = [CausalLMPolicy.from_pretrained(args.model, **settings) for _ in range(2)]
    config = MAGRPOConfig(num_agents=2, num_turns=1, num_train_epochs=1, num_generations=4, max_new_tokens=args.new_tokens,
                          temperature=1.0, top_p=1.0, top_k=None, items_per_step=1, rollout_buffer_size=1, eval_interval=0,
                          early_termination_threshold=None, agent_learning_rate=1e-6, progress_bar=False, rollout_log_steps=0,
                          save_final_checkpoint=False, fsdp=args.fsdp, fsdp_gather=args.gather)
    trainer = MAGRPOTrainer(env=DialogueEnv(task), policies=policies, args=config)
    grad_bytes = {}
    for agent, optimizer in trainer.optimizers.items():
        step = optimizer.step

        def measured(*a, _agent=agent, _step=step, _optimizer=optimizer, **k):
            grad_bytes[_agent] = local_nbytes(p.grad for g in _optimizer.param_groups for p in g["params"])
            return _step(*a, **k)

        optimizer.step = measured
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    mine = {
        "rank": trainer.dist.rank,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "cuda_peak_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None,
        "param_mb": {a: local_nbytes(trainer.policies[a].parameters()) / 1e6 for a in trainer.agents},
        "grad_mb": {a: b / 1e6 for a, b in grad_bytes.items()},
        "optimizer_mb": {a: local_nbytes(t for s in o.state.values() for t in s.values() if t.dim() > 0) / 1e6
                         for a, o in trainer.optimizers.items()},
    }
    ranks = [None] * trainer.dist.world_size
    dist.all_gather_object(ranks, mine)
    if trainer.dist.is_main:
        with open(args.result, "w") as handle:
            json.dump({"fsdp": args.fsdp, "gather": args.gather, "items": args.items, "seconds_per_item": seconds / args.items,
                       "steps": trainer.state.global_step, "ranks": ranks}, handle, indent=2)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown with live gloo groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default="fsdp_benchmark.json")
    parser.add_argument("--port", type=int, default=29561)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--gather", default="model", choices=("model", "layer"), help="fsdp_gather of the fsdp mode")
    parser.add_argument("--layer", action="store_true", help="also run fsdp with fsdp_gather=\"layer\"")
    parser.add_argument("--result")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from machine import print_machine

    print_machine()
    results = []
    modes = [(False, "model"), (True, "model")] + ([(True, "layer")] if args.layer else [])
    for fsdp, gather in modes:
        result = f"{args.out}.{'fsdp' if fsdp else 'dp'}.{gather}.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(args.port), HERE,
                   "--worker", "--items", str(args.items), "--new-tokens", str(args.new_tokens), "--model", args.model, "--result", result]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        subprocess.run(command + (["--fsdp", "--gather", gather] if fsdp else []), check=True, env=env)
        with open(result) as handle:
            results.append(json.load(handle))
        os.remove(result)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=2)
    for r in results:
        rss = ", ".join(f"{x['peak_rss_gb']:.2f}" for x in r["ranks"])
        params = sum(r["ranks"][0]["param_mb"].values())
        grads = sum(r["ranks"][0]["grad_mb"].values())
        state = sum(r["ranks"][0]["optimizer_mb"].values())
        mode = ("fsdp" + (' (layer by layer)' if r["gather"] == "layer" else "")) if r["fsdp"] else "plain DP"
        print(f"{mode}: {r['seconds_per_item']:.2f} s/item, peak RSS per rank {rss} GB, "
              f"rank 0 holds params {params:.0f} MB, grads {grads:.0f} MB, AdamW state {state:.0f} MB")


if __name__ == "__main__":
    main()
