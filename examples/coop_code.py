"""Train two language models to write code together on HumanEval (CoopCode) with MAGRPO.

Agent "aux" writes a helper function ``aux(...)``, agent "main" the problem's entry point, which may
call it; both share the task's reward in levels (structure, syntax, tests, cooperation; see
``llm_marl/tasks/code/``). Code runs in the sandbox, the K answers of every tree node in parallel.

By default the two agents are the tiny local GPT-2 models (no download, CPU), trained for a few
optimizer steps with short answers: a smoke run that shows the whole loop end to end (the tiny
models know English prose, not Python, so expect rewards at the floor, -4). The first run builds
and caches the tiny model, which takes a few minutes more. With ``--model`` any
causal LM id or path is loaded with ``from_pretrained`` (one copy per agent), e.g. on a GPU::

    python examples/coop_code.py                                  # tiny models, CPU, 1-2 minutes
    python examples/coop_code.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --device cuda \\
        --steps 200 --max-new-tokens 256 --num-generations 4 --eval-items 32 --output-dir runs/coop_code

Eval metrics (``eval/turn_k/pass_rate``, ``syntax_valid_rate``, ``tests_passed``, ``timeout_rate``,
``cooperation_rate``) come from the task's eval hooks; with ``--output-dir`` they are also written to
TensorBoard logs there, and the trained agents are saved under ``output_dir/final``.
"""

from __future__ import annotations

import argparse
import time

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners.config import MAGRPOConfig
from llm_marl.learners.reinforce.trainer import MAGRPOTrainer
from llm_marl.policies.causal_lm import CausalLMPolicy
from llm_marl.tasks.code import CoopCodeTask, eval_aggregator, eval_logger


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="causal LM id or path (default: the tiny local models)")
    parser.add_argument("--device", default=None, help="e.g. cuda, cuda:0 (default: where the model loads, CPU)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps to train (max_steps)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="answer length cap (default: 32 tiny, 256 --model)")
    parser.add_argument("--num-generations", type=int, default=2, help="K: answers per agent per node")
    parser.add_argument("--num-turns", type=int, default=2, help="turns per episode")
    parser.add_argument("--feedback", default="full", choices=("full", "passfail", "plain"), help="multi-turn feedback")
    parser.add_argument("--joint-mode", default="aligned", choices=("aligned", "cross"))
    parser.add_argument("--train-items", type=int, default=None, help="use only the first N train problems")
    parser.add_argument("--eval-items", type=int, default=2, help="eval problems per evaluation")
    parser.add_argument("--eval-interval", type=int, default=16, help="evaluate every N dataset batches (0: never)")
    parser.add_argument("--learning-rate", type=float, default=None, help="default: 1e-4 tiny, 5e-6 --model")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--output-dir", default=None, help="run directory (logs, checkpoints, final models)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def make_policies(args: argparse.Namespace, max_new_tokens: int) -> list[CausalLMPolicy]:
    settings = dict(max_new_tokens=max_new_tokens, temperature=args.temperature, top_p=1.0, top_k=None)
    if args.model is None:
        from llm_marl.policies.tiny import load_tiny

        policies = []
        for _ in ("aux", "main"):
            model, tokenizer = load_tiny()  # built once and cached; each agent gets its own copy
            policies.append(CausalLMPolicy(model, tokenizer, device=args.device, **settings))
        return policies
    return [
        CausalLMPolicy.from_pretrained(args.model, model_kwargs={"torch_dtype": "auto"}, device=args.device, **settings)
        for _ in ("aux", "main")
    ]


def main(argv=None) -> dict[str, float]:
    args = parse_args(argv)
    tiny = args.model is None
    max_new_tokens = args.max_new_tokens or (32 if tiny else 256)
    task = CoopCodeTask(num_turns=args.num_turns, feedback=args.feedback)
    env = DialogueEnv(task, split="train")
    if args.train_items:
        env.data = env.data.select(range(min(args.train_items, len(env.data))))
    eval_env = DialogueEnv(task, split="eval")
    config = MAGRPOConfig(
        num_agents=2,
        num_turns=args.num_turns,
        num_train_epochs=1,
        max_steps=args.steps,
        num_generations=args.num_generations,
        joint_mode=args.joint_mode,
        max_new_tokens=max_new_tokens,
        temperature=args.temperature,
        top_p=1.0,
        top_k=None,
        agent_learning_rate=args.learning_rate or (1e-4 if tiny else 5e-6),
        rollout_buffer_size=2,
        eval_interval=args.eval_interval,
        eval_num_samples=args.eval_items,
        logging_steps=1,
        output_dir=args.output_dir,
        seed=args.seed,
    )
    # early_termination_threshold keeps its default, -0.2: rewards are score - 4, so a node whose
    # answers average a score above 3.8 gets no second turn.
    trainer = MAGRPOTrainer(
        env=env,
        policies=make_policies(args, max_new_tokens),
        args=config,
        eval_env=eval_env,
        eval_logger=eval_logger,
        eval_aggregator=eval_aggregator,
    )
    start = time.perf_counter()
    before = trainer.evaluate()
    state = trainer.train()
    after = trainer.evaluate()
    seconds = time.perf_counter() - start
    print(f"\ntrained {state.global_step} optimizer steps on {state.batch_step} problems in {seconds:.0f}s")
    for name in sorted(after):
        print(f"  {name:40s} before {before.get(name, float('nan')):8.3f}   after {after[name]:8.3f}")
    if args.output_dir:
        trainer.save_model(f"{args.output_dir}/final")
        print(f"saved the agents under {args.output_dir}/final")

    observations, _ = eval_env.reset(options={"index": 0})
    answers = {agent: trainer.policies[agent].sample([observations[agent]], 1)[0][0].text for agent in eval_env.agents}
    _, rewards, _, _, infos = eval_env.step(answers)
    details = infos["main"]["reward_details"]
    print(f"\n{eval_env.item['task_id']}: reward {rewards['main']:.2f} (score {details['score']:.2f}, levels {details['levels']})")
    for agent, text in answers.items():
        print(f"--- {agent} wrote ---\n{text.strip()[:400]}")
    return after


if __name__ == "__main__":
    main()
