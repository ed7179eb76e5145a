"""``llm-marl serve`` under load: tokens/s and per-request latency at 1, 4 and 16 concurrent requests.

The served agents: SmolLM2-135M-Instruct (the named model ``smollm2-135m``, fetched from PyPI and
converted once, :mod:`llm_marl.policies.models`) as

- **team**: two fresh LoRA adapters (r = 8 on q/k/v/o, agents ``writer`` and ``editor``) on one
  base: requests alternate between the two agents, and one decode loop serves both;
- **full**: one full model (agent ``solo``).

Each is served by the real server (uvicorn on a free port of 127.0.0.1, the same app as the
command) and driven by the real ``openai`` client: at concurrency C, C client threads each send
``--requests`` chat requests one after another (closed loop), every request asking for exactly
``--tokens`` tokens (``max_tokens`` = ``min_tokens``, temperature 1, a different short prompt
each). Reported per (variant, C): answer tokens per second over the whole round (wall clock),
and the mean and 90th-percentile latency of a request (send to full answer). A warm-up request
runs first. The target (issue 45): at 16 concurrent requests, at least 4x the tokens/s of 1.

Usage::

    python benchmarks/serve.py                       # team and full, C = 1, 4, 16
    python benchmarks/serve.py --variants full --concurrency 1 16 --tokens 32
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.machine import print_machine  # noqa: E402

PROMPTS = [
    "Write one sentence about the sea.",
    "Name a colour and say why you like it.",
    "Describe a cat in a few words.",
    "What is a good name for a boat?",
    "Say something kind to a friend.",
    "Give a short tip for cooking rice.",
    "What makes a good story?",
    "Describe the morning sky.",
]


def serve(variant: str, threads: int):
    import torch

    torch.set_num_threads(threads)
    from llm_marl.serve.agents import load_agents
    from llm_marl.serve.app import create_app
    from llm_marl.serve.config import ServeConfig
    from llm_marl.serve.scheduler import Scheduler
    from llm_marl.serve.server import BackgroundServer

    if variant == "team":
        agents = load_agents(model="smollm2-135m", agents=["writer", "editor"], lora_r=8)
    else:
        agents = load_agents(model="smollm2-135m", agents=["solo"])
    scheduler = Scheduler()
    server = BackgroundServer(create_app(agents, scheduler, ServeConfig())).start()
    return server, scheduler, agents.names


def round_at(base_url: str, names: list[str], concurrency: int, requests: int, tokens: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=3600)
    latencies: list[float] = []
    produced = [0]
    lock = threading.Lock()

    def worker(w: int) -> None:
        for r in range(requests):
            i = w * requests + r
            start = time.perf_counter()
            reply = client.chat.completions.create(
                model=names[i % len(names)],
                messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                max_tokens=tokens,
                temperature=1.0,
                extra_body={"min_tokens": tokens},
            )
            took = time.perf_counter() - start
            with lock:
                latencies.append(took)
                produced[0] += reply.usage.completion_tokens

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    latencies.sort()
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "tokens": produced[0],
        "seconds": round(wall, 2),
        "tokens_per_s": round(produced[0] / wall, 1),
        "latency_mean_s": round(statistics.mean(latencies), 2),
        "latency_p90_s": round(latencies[max(0, math.ceil(0.9 * len(latencies)) - 1)], 2),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["team", "full"], choices=["team", "full"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=2, help="requests per client thread")
    parser.add_argument("--tokens", type=int, default=48, help="answer tokens per request")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    info = print_machine()
    results = []
    for variant in args.variants:
        server, scheduler, names = serve(variant, args.threads)
        try:
            round_at(server.base_url, names, 1, 1, 4)  # warm-up
            base = None
            for concurrency in args.concurrency:
                before = len(scheduler.records)
                row = round_at(server.base_url, names, concurrency, args.requests, args.tokens)
                batches = list(scheduler.records)[before:]
                row["variant"] = variant
                row["mean_rows_per_batch"] = round(statistics.mean(b.rows for b in batches), 1) if batches else None
                base = base or row["tokens_per_s"]
                row["speedup"] = round(row["tokens_per_s"] / base, 2)
                results.append(row)
                print(
                    f"{variant:>5}  C={concurrency:<3} {row['tokens_per_s']:>7.1f} tokens/s  x{row['speedup']:<5}  "
                    f"latency mean {row['latency_mean_s']:.2f} s, p90 {row['latency_p90_s']:.2f} s  "
                    f"({row['requests']} requests, {row['tokens']} tokens, {row['seconds']} s)",
                    flush=True,
                )
        finally:
            server.stop()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"machine": info, "args": vars(args), "results": results}, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
