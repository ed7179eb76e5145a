"""The endpoint's overhead per call while training a program (issue 45).

Grows the same K-branch rollout trees (MAGRPO's, K = 2, 2 turns) twice with instant scripted
agents, so that only the environment costs anything: once for the writer/editor program of
tests/test_programs.py run by ProgramEnv (the real openai client, HTTP on 127.0.0.1, prefix
replay for forks), once for the hand-written CooperativeTask it equals. The overhead per call is
(program time - task time) / calls the program made (replayed calls included), in wall-clock
time and in CPU time of all the process's threads (which a busy machine inflates less). Target:
< 5 ms.

    OMP_NUM_THREADS=1 python benchmarks/program_overhead.py [--items 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm_marl.envs import DialogueEnv, ProgramEnv  # noqa: E402
from llm_marl.learners import MAGRPOConfig  # noqa: E402
from llm_marl.learners.tree import collect_trees  # noqa: E402
from llm_marl.policies.scripted import ScriptedPolicy  # noqa: E402

import test_programs  # noqa: E402  (the program and the task)
from machine import print_machine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    ns = parser.parse_args()
    items = [{"topic": f"topic {i}"} for i in range(ns.items)]
    calls = []

    def program(item, client):
        calls.append(1)
        return test_programs.team(item, client)

    class Task(test_programs.Team):
        def dataset(self, split):
            import datasets

            return datasets.Dataset.from_list(items)

    policies = {a: ScriptedPolicy(lambda o, k: [f"answer {i}" for i in range(k)]) for a in ("writer", "editor")}
    args = MAGRPOConfig(num_turns=2, num_generations=2, early_termination_threshold=None)
    indices = list(range(ns.items))
    program_env = ProgramEnv(program, ("writer", "editor"), items, num_turns=2)
    collect_trees(program_env, policies, indices[:1], args)  # start the endpoint, import the client
    calls.clear()
    best = {}
    for name, env in (("task", DialogueEnv(Task())), ("program", program_env)):
        times, cpu = [], []
        for _ in range(ns.repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            collect_trees(env, policies, indices, args)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        best[name], best[name + "_cpu"] = min(times), min(cpu)
    program_env.close()
    # every run of the program makes its two calls (the writer's, live or replayed, and the
    # editor's): the root's run goes on in the first branch, each other branch is a run of its own
    runs_per_repeat = len(calls) / ns.repeats
    http_calls = runs_per_repeat * 2
    overhead_ms = (best["program"] - best["task"]) / http_calls * 1000
    print_machine()
    print(f"{ns.items} items, K = 2, 2 turns; best of {ns.repeats}")
    print(f"task trees {best['task'] * 1000:.1f} ms; program trees {best['program'] * 1000:.1f} ms; "
          f"{runs_per_repeat:.0f} program runs, {http_calls:.0f} calls")
    cpu_ms = (best["program_cpu"] - best["task_cpu"]) / http_calls * 1000
    print(f"overhead per call: {overhead_ms:.2f} ms wall, {cpu_ms:.2f} ms of CPU time (all threads)")


if __name__ == "__main__":
    main()
