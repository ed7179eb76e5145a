"""Mutation harness: plant known bugs one at a time and check that the tests catch each one.

Run on demand (not collected by pytest: the file name does not start with ``test_``)::

    python tests/mutants.py                  # every mutant, one at a time
    python tests/mutants.py --list           # the curated list
    python tests/mutants.py -k kl -k sha     # only mutants whose name contains one of these
    python tests/mutants.py --jobs 2         # two mutants at once
    python tests/mutants.py --check          # only report stale entries (no tests run)

Each mutant is (name, file, exact original snippet, mutated snippet, tests). For each one the
repository (without .git, virtual environments and caches) is copied to a temporary folder, the
snippet replaced there, and the mapped tests run with ``PYTHONPATH`` pointing at the copy. The
mutant is **killed** when the tests fail, **survived** when they pass. A mutant whose original
snippet is no longer in its file (the code moved or changed) is **stale**: it counts as not
killed and its entry must be updated. Tests that run past ``--timeout`` count as killed (the
mutant hangs the suite), shown as ``timeout``; a pytest usage error (a test id that no longer
exists, no tests collected) is an ``error`` and not killed. The score is killed / all mutants.

Map each mutant to the smallest set of tests that should kill it (a file, or ``file::test``
node ids): the harness is CPU-heavy. A new capability adds its own mutants here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_IGNORED_EVERYWHERE = shutil.ignore_patterns(".git", ".venv", "venv", "__pycache__", "*.pyc", ".pytest_cache", "*.egg-info", ".hypothesis")


def IGNORED(folder: str, names: list[str]) -> set[str]:
    """What the copy leaves out: caches and environments anywhere, run folders (``runs/``) at the
    top only (``llm_marl/runs/`` is a package)."""
    ignored = set(_IGNORED_EVERYWHERE(folder, names))
    if os.path.abspath(folder) == REPO and "runs" in names:
        ignored.add("runs")
    return ignored


@dataclass(frozen=True)
class Mutant:
    """One planted bug: ``original`` (found exactly once in ``file``) becomes ``mutated``."""

    name: str
    file: str
    original: str
    mutated: str
    tests: tuple[str, ...]


MUTANTS: list[Mutant] = [
    # --- the 16 bugs of the test audit (issue 19) ------------------------------------------------
    Mutant(
        "trainer hard-codes advantage_mode='mean' and normalize=True",
        "llm_marl/learners/reinforce/trainer.py",
        "advantage_mode=args.advantage_mode,\n            normalize={agent: args.advantage_normalization_of(i) for i, agent in enumerate(self.agent_ids)},",
        'advantage_mode="mean",\n            normalize=True,',
        ("tests/test_wiring.py",),
    ),
    Mutant(
        "children lose cross_aggregation (always sum below the root)",
        "llm_marl/learners/tree.py",
        "child = RolloutNode(depth + 1, node.index, dict(observations), cross_aggregation=cross_aggregation)",
        "child = RolloutNode(depth + 1, node.index, dict(observations))",
        ("tests/test_tree.py::test_cross_aggregation_applies_below_the_root",),
    ),
    Mutant(
        "reference-KL penalty added to the returns instead of subtracted",
        "llm_marl/learners/buffer.py",
        "returns = [g - kl_coef * d for g, d in zip(returns, penalty)]",
        "returns = [g + kl_coef * d for g, d in zip(returns, penalty)]",
        ("tests/test_wiring.py",),
    ),
    Mutant(
        "loss averaged per rank instead of over all ranks",
        "llm_marl/learners/update.py",
        "local = loss_sum / total",
        "local = loss_sum / len(batch)",
        ("tests/test_distributed.py::test_two_gloo_ranks_match_one_process_on_the_union",),
    ),
    Mutant(
        "checkpoint manifest SHA-256 not checked (size only)",
        "llm_marl/runs/checkpoint.py",
        'if os.path.getsize(file) != expected["size"] or _sha256(file) != expected["sha256"]:',
        'if os.path.getsize(file) != expected["size"]:',
        ("tests/test_reliability.py",),
    ),
    Mutant(
        "min_new_tokens off by one",
        "llm_marl/policies/sampling.py",
        "ban_eos=step < min_new_tokens",
        "ban_eos=step < min_new_tokens - 1",
        ("tests/test_causal_lm_policy.py::test_min_new_tokens_with_eos_biased_logits",),
    ),
    Mutant(
        "sampling builds an autograd graph",
        "llm_marl/policies/causal_lm.py",
        "            with torch.inference_mode():\n                answers",
        "            with torch.enable_grad():\n                answers",
        ("tests/test_causal_lm_policy.py::test_sampling_restores_mode_and_builds_no_graph",),
    ),
    Mutant(
        "RLOO baseline divides by K instead of K-1",
        "llm_marl/advantages.py",
        "(returns.sum() - returns) / (k - 1)",
        "(returns.sum() - returns) / k",
        ("tests/test_advantages.py",),
    ),
    Mutant(
        "normalization by the sample std instead of the population std",
        "llm_marl/advantages.py",
        "advantages.std(correction=0)",
        "advantages.std(correction=1)",
        ("tests/test_advantages.py",),
    ),
    Mutant(
        "inner return sums the children's returns instead of averaging them",
        "llm_marl/advantages.py",
        "return sum(values) / len(values)",
        "return sum(values)",
        ("tests/test_tree.py",),
    ),
    Mutant(
        "optimistic credit takes the children's mean instead of their max",
        "llm_marl/advantages.py",
        "        return max(values)\n    if how == \"softmax\"",
        "        return sum(values) / len(values)\n    if how == \"softmax\"",
        ("tests/test_stalls.py",),
    ),
    Mutant(
        "groups whose advantages are all zero are not replaced by dynamic sampling",
        "llm_marl/learners/stalls.py",
        "    dead = [i for i, s in enumerate(samples) if _trained(s) and not _carries_signal(s)]",
        "    dead = []",
        ("tests/test_stalls.py",),
    ),
    Mutant(
        "the annealed entropy bonus keeps its first coefficient",
        "llm_marl/learners/stalls.py",
        "    return start + (final - start) * min(max(batch / (batches - 1), 0.0), 1.0)",
        "    return start",
        ("tests/test_stalls.py",),
    ),
    Mutant(
        "agent_learning_rates is ignored: every agent gets agent_learning_rate",
        "llm_marl/learners/config.py",
        "return self.agent_learning_rate if self.agent_learning_rates is None else self.agent_learning_rates[position]",
        "return self.agent_learning_rate",
        ("tests/test_stalls.py",),
    ),
    Mutant(
        "agent_advantage_normalization is ignored: every agent gets advantage_normalization",
        "llm_marl/learners/config.py",
        "return self.advantage_normalization if self.agent_advantage_normalization is None else self.agent_advantage_normalization[position]",
        "return self.advantage_normalization",
        ("tests/test_stalls.py",),
    ),
    Mutant(
        "natural_gradient is ignored: the plain gradient is stepped",
        "llm_marl/learners/update.py",
        'if agent is not None and getattr(self.args, "natural_gradient", False):',
        "if False:",
        ("tests/test_natural_gradient.py",),
    ),
    Mutant(
        "the natural gradient's Fisher weights every observation alike (its share of the samples ignored)",
        "llm_marl/learners/natural_gradient.py",
        "fisher_factor(z, counts[observation_key(o)] / len(observations))",
        "fisher_factor(z, 1.0 / len(distinct))",
        ("tests/test_natural_gradient.py",),
    ),
    Mutant(
        "the natural gradient uses the Euclidean metric on the logits (no Fisher factor)",
        "llm_marl/learners/natural_gradient.py",
        "fisher_rows = torch.block_diag(*factors).T @ jacobian if factors else jacobian",
        "fisher_rows = jacobian",
        ("tests/test_natural_gradient.py",),
    ),
    Mutant(
        "distributed natural_gradient preconditions with this rank's observations only",
        "llm_marl/learners/update.py",
        "observations = self.dist.gather([s.observation for s in batch])",
        "observations = [s.observation for s in batch]",
        ("tests/test_distributed.py::test_two_ranks_precondition_with_the_natural_gradient_of_the_union",),
    ),
    Mutant(
        "agent_rollout_buffer_sizes is ignored: every agent gets rollout_buffer_size",
        "llm_marl/learners/config.py",
        "return self.rollout_buffer_size if self.agent_rollout_buffer_sizes is None else self.agent_rollout_buffer_sizes[position]",
        "return self.rollout_buffer_size",
        ("tests/test_natural_gradient.py",),
    ),
    Mutant(
        "best-of-group imitation gives each tied best answer 1 instead of 1/n",
        "llm_marl/advantages.py",
        "return best.to(returns.dtype) / best.sum()",
        "return best.to(returns.dtype)",
        ("tests/test_advantages.py", "tests/test_stalls.py"),
    ),
    Mutant(
        "best-of-group imitation gives a group whose returns coincide a share each (no zero group)",
        "llm_marl/advantages.py",
        "    if bool(best.all()):\n        return torch.zeros_like(returns)\n",
        "",
        ("tests/test_advantages.py", "tests/test_stalls.py"),
    ),
    Mutant(
        "every agent's answers are credited by agent 0's position",
        "llm_marl/advantages.py",
        "groups[combo[position]].append(value)",
        "groups[combo[0]].append(value)",
        ("tests/test_advantages.py",),
    ),
    Mutant(
        "early termination on mean >= threshold instead of >",
        "llm_marl/advantages.py",
        "sum(rewards) / len(rewards) > threshold",
        "sum(rewards) / len(rewards) >= threshold",
        ("tests/test_tree.py",),
    ),
    Mutant(
        "discount ignored (returns always undiscounted)",
        "llm_marl/learners/tree.py",
        "            _compute_returns(root, discount, tree_return_aggregation, tree_return_temperature)",
        "            _compute_returns(root, 1.0, tree_return_aggregation, tree_return_temperature)",
        ("tests/test_tree.py",),
    ),
    Mutant(
        "partly filled buffers not consumed at the end of an epoch",
        "llm_marl/learners/reinforce/trainer.py",
        "        self._update()\n        if not self._update_cut():",
        "        pass\n        if not self._update_cut():",
        ("tests/test_learners.py",),
    ),
    Mutant(
        "the last partial mini-batch of a buffer is dropped",
        "llm_marl/rollouts.py",
        "for start in range(0, len(self.samples), batch_size)]",
        "for start in range(0, len(self.samples) - batch_size + 1, batch_size)]",
        ("tests/test_learners.py",),
    ),
    Mutant(
        "resume does not restore the RNG states",
        "llm_marl/runs/checkpoint.py",
        '    restore_rng(trainer.policies, torch.load(os.path.join(own, "rng.pt"), weights_only=False), _envs(trainer))\n',
        "",
        ("tests/test_reliability.py::test_stop_resume_equals_uninterrupted", "tests/test_reliability_lm.py::test_lm_stop_resume_equals_uninterrupted"),
    ),
    Mutant(
        "evaluation draws from the run's own generators",
        "llm_marl/learners/evaluation.py",
        " as batch, seeded_aside(seed, trainer.policies):",
        " as batch:",
        ("tests/test_eval_randomness.py",),
    ),
    Mutant(
        "an update waits for every agent's buffer",
        "llm_marl/learners/update.py",
        "        return any(self._buffer_full(agent) for agent in self.agent_ids)\n",
        "        return all(self._buffer_full(agent) for agent in self.agent_ids)\n",
        ("tests/test_turn_based.py",),
    ),
    Mutant(
        "a partly filled buffer is consumed with the full ones",
        "llm_marl/learners/update.py",
        "if not full_only or self.dist.max(int(self._buffer_full(agent)))]",
        "if True]",
        ("tests/test_turn_based.py",),
    ),
    # --- more planted bugs across the library --------------------------------------------------------
    Mutant(
        "optimizer steps counted once per update instead of per mini-batch",
        "llm_marl/learners/update.py",
        "            self.state.global_step += 1\n",
        "            self.state.global_step += 1 if i == 0 else 0\n",
        ("tests/test_learners.py",),
    ),
    Mutant(
        "resume starts with empty rollout buffers",
        "llm_marl/runs/checkpoint.py",
        'trainer.buffers = {keys.get(a, a): RolloutBuffer(extra["buffers"][a]) for a in trainer.agent_ids}',
        "trainer.buffers = {a: RolloutBuffer() for a in trainer.agent_ids}",
        ("tests/test_reliability.py::test_resume_from_a_checkpoint_with_filled_buffers_equals_uninterrupted",),
    ),
    Mutant(
        "save_total_limit keeps one checkpoint too few",
        "llm_marl/runs/checkpoint.py",
        "for path in paths[: max(0, len(paths) - limit)]:",
        "for path in paths[: max(0, len(paths) - limit + 1)]:",
        ("tests/test_reliability.py::test_save_total_limit_keeps_newest",),
    ),
    Mutant(
        "MAReMax baseline is the min instead of the max",
        "llm_marl/advantages.py",
        "return returns - returns.max()",
        "return returns - returns.min()",
        ("tests/test_advantages.py", "tests/test_wiring.py"),
    ),
    Mutant(
        "tabular log-probs over the wrong axis",
        "llm_marl/policies/tabular.py",
        "table = torch.log_softmax(self.logits[rows], dim=-1)",
        "table = torch.log_softmax(self.logits[rows], dim=0)",
        ("tests/test_learners.py", "tests/test_learning.py::test_coordination_game_optimum"),
    ),
    Mutant(
        "top-p drops the token that crosses the mass",
        "llm_marl/policies/sampling.py",
        "mass_before = probs.cumsum(dim=-1) - probs",
        "mass_before = probs.cumsum(dim=-1)",
        ("tests/test_causal_lm_policy.py",),
    ),
    Mutant(
        "scoring ignores the score temperature",
        "llm_marl/policies/scoring.py",
        "    logits = logits.float() / temperature\n    chosen",
        "    logits = logits.float()\n    chosen",
        ("tests/test_causal_lm_policy.py::test_log_probs_equal_hand_computation",),
    ),
    Mutant(
        "writing reward ramp not capped at 1",
        "llm_marl/tasks/writing/task.py",
        "return min(1.0, max(0.0, (x - zero) / (full - zero)))",
        "return max(0.0, (x - zero) / (full - zero))",
        ("tests/test_writing_task.py",),
    ),
    Mutant(
        "dialogue env plays one turn more than num_turns",
        "llm_marl/envs/dialogue.py",
        "done = self.task.num_turns is not None and len(history) >= self.task.num_turns",
        "done = self.task.num_turns is not None and len(history) > self.task.num_turns",
        ("tests/test_dialogue_env.py",),
    ),
    Mutant(
        "matrix game payoff read transposed (column, row)",
        "llm_marl/tasks/matrix.py",
        "value = self.payoff[self.menu.index(row)][self.menu.index(column)]",
        "value = self.payoff[self.menu.index(column)][self.menu.index(row)]",
        ("tests/test_dialogue_env.py",),
    ),
    Mutant(
        "sandbox pool ignores max_workers",
        "llm_marl/sandbox/runner.py",
        "with ThreadPoolExecutor(max_workers=min(workers, len(codes)),",
        "with ThreadPoolExecutor(max_workers=len(codes),",
        ("tests/test_sandbox.py::test_run_programs_runs_at_most_max_workers_at_once_in_order",),
    ),
    Mutant(
        "sandbox timeout reported as an ordinary kill",
        "llm_marl/sandbox/runner.py",
        '    if timed_out:\n        return f"timeout after {float(timeout)}s"\n',
        "",
        ("tests/test_sandbox.py::test_infinite_loop_is_killed_at_the_timeout",),
    ),
    Mutant(
        "sandbox without a process limit",
        "llm_marl/sandbox/runner.py",
        '"RLIMIT_NPROC": (processes, processes),',
        '"RLIMIT_NPROC": (100000, 100000),',
        ("tests/test_sandbox.py::test_process_limit_binds_before_fork_and_thread_bombs",),
    ),
    Mutant(
        'transitions run for every branch (eager stepping even where the env splits the step)',
        'llm_marl/learners/tree.py',
        'self.lazy = callable(getattr(env, "step_rewards", None)) and callable(getattr(env, "advance", None))',
        'self.lazy = False',
        ('tests/test_lazy_transitions.py',),
    ),
    Mutant(
        "config num_turns and the env's horizon may disagree",
        'llm_marl/learners/reinforce/trainer.py',
        '        check_horizon(self.env, self.args.num_turns, "env")\n',
        '',
        ('tests/test_trainer_checks.py',),
    ),
    Mutant(
        'evaluation falls back to the training items',
        'llm_marl/learners/reinforce/trainer.py',
        'self.eval_env, self.no_eval_reason = _eval_split(self.env)',
        'self.eval_env, self.no_eval_reason = _eval_split(self.env)[0] or self.env, None',
        ('tests/test_honest_eval.py',),
    ),
    Mutant(
        "one agent steps before the others' losses are checked",
        'llm_marl/learners/update.py',
        'failed = next((r.error for r in results if r.error), None)',
        'failed = None',
        ('tests/test_atomic_update.py',),
    ),
    Mutant(
        'two agents may share one set of weights',
        'llm_marl/learners/checks.py',
        '            if first != agent:\n',
        '            if False:\n',
        ('tests/test_trainer_checks.py',),
    ),
    Mutant(
        'early_termination_threshold=nan accepted',
        'llm_marl/learners/config.py',
        '            _finite(self, "early_termination_threshold")\n',
        '            pass\n',
        ('tests/test_trainer_checks.py',),
    ),
    Mutant(
        'sandboxed code may start processes (no seccomp prelude)',
        'llm_marl/sandbox/runner.py',
        'prelude = None if limits.new_processes or not isolation.seccomp else _NOPROC',
        'prelude = None',
        ('tests/test_sandbox.py::test_a_program_cannot_spawn_a_subprocess', 'tests/test_sandbox.py::test_a_program_cannot_exec_a_shell'),
    ),
    Mutant(
        'the seccomp filter also refuses threads',
        'llm_marl/sandbox/_noproc.py',
        'code.append((jset, to("ALLOW"), to("DENY"), clone_thread))',
        'code.append((jset, to("DENY"), to("DENY"), clone_thread))',
        ('tests/test_sandbox.py::test_threads_work_without_new_processes',),
    ),
    # --- actor-critic learners (issue 15) ---------------------------------------------------------
    Mutant(
        "TD target without the discount",
        "llm_marl/learners/actor_critic/math.py",
        "return float(reward) + discount * float(next_value)",
        "return float(reward) + float(next_value)",
        ("tests/test_actor_critic.py::test_t3_targets_and_advantages_from_a_three_turn_rollout",),
    ),
    Mutant(
        "an early-stopped episode is bootstrapped",
        "llm_marl/learners/actor_critic/trainer.py",
        "after = after_value(child, agent, name, out)",
        "after = after_value(child, agent, name, out) if child is not None else float(values[name][n, out])",
        ("tests/test_actor_critic.py::test_t4_an_early_stop_is_not_bootstrapped",),
    ),
    Mutant(
        "OpenSpiel: a fork shares the game state instead of cloning it",
        "llm_marl/envs/openspiel.py",
        "twin.state = None if self.state is None else self.state.clone()",
        "twin.state = self.state",
        ("tests/test_openspiel.py::test_chance_is_keyed_by_item_and_history_so_branches_and_replays_reproduce",),
    ),
    Mutant(
        "OpenSpiel: an action id outside the legal moves is played anyway",
        "llm_marl/envs/openspiel.py",
        "return int(answer) if int(answer) in legal else None",
        "return int(answer)",
        ("tests/test_openspiel.py::test_an_illegal_or_unparsable_answer_ends_the_episode_with_the_penalty",),
    ),
    Mutant(
        "OpenSpiel on_illegal='random': an illegal answer still ends the game",
        "llm_marl/envs/openspiel.py",
        "        if illegal and self.on_illegal == \"end\":",
        "        if illegal:",
        ("tests/test_openspiel.py::test_random_on_illegal_keeps_the_tree_growing_and_counts_the_illegal_rate",),
    ),
    Mutant(
        "OpenSpiel on_illegal='random': the penalty is not added to the step's reward",
        "llm_marl/envs/openspiel.py",
        "rewards = {a: float(delta[0]) + self.illegal_penalty * len(illegal) for a in agents}",
        "rewards = {a: float(delta[0]) for a in agents}",
        ("tests/test_openspiel.py::test_random_on_illegal_plays_a_legal_move_and_adds_the_penalty",),
    ),
    Mutant(
        "OpenSpiel on_illegal='random': the substitute comes from the env's shared RNG (forks draw differently)",
        "llm_marl/envs/openspiel.py",
        "rng = np.random.default_rng(_stream_seed(\"illegal\", self.split, self.item_index, tuple(self.state.history()), player))",
        "rng = self._np_random",
        ("tests/test_openspiel.py::test_the_substituted_move_is_uniform_over_legal_moves_and_reproduces",),
    ),
    Mutant(
        "--policy lm plays an OpenSpiel game from its tabular keys, not text prompts",
        "llm_marl/assembly.py",
        "    if text and getattr(env, \"text\", None) is False:",
        "    if False:",
        ("tests/test_games_lm.py",),
    ),
    Mutant(
        "a game run keeps the config's early termination (trees cut after the first move)",
        "llm_marl/cli.py",
        "GAME_RUN: dict[str, Any] = {\"early_termination_threshold\": None}",
        "GAME_RUN: dict[str, Any] = {}",
        ("tests/test_games_lm.py",),
    ),
    Mutant(
        "illegal_rate counts every acting agent's joint actions as illegal",
        "llm_marl/learners/evaluation.py",
        "seen[0] += agent in details[\"illegal\"]",
        "seen[0] += 1",
        ("tests/test_openspiel.py::test_illegal_rate_is_logged_per_agent",),
    ),
    Mutant(
        "programs: a step is taken while an async program's loop still runs",
        "llm_marl/programs/run.py",
        "return self.done or (bool(self.pending) and self._idle and self._in_flight == self._held_ours)",
        "return self.done or (bool(self.pending) and self._in_flight == self._held_ours)",
        ("tests/test_programs.py::test_an_async_program_working_between_two_calls_is_waited_for_until_its_loop_is_idle",),
    ),
    Mutant(
        "programs: a ProgramEnv's eval_items are not its eval split",
        "llm_marl/learners/reinforce/trainer.py",
        "        if callable(split) and (held_out := split()) is not None:",
        "        if False:",
        ("tests/test_programs.py::test_a_program_env_with_eval_items_is_evaluated_on_them_without_an_eval_env",),
    ),
    Mutant(
        "programs: a replayed call is not compared with the recorded one",
        "llm_marl/programs/env.py",
        "                if outcome.calls[agent] != observation:",
        "                if False:",
        ("tests/test_programs.py::test_a_replayed_call_whose_messages_differ_stops_the_run_naming_the_call_and_message",),
    ),
    Mutant(
        "turn-based: every agent is asked at every node, acting or not",
        "llm_marl/learners/tree.py",
        "asked = {agent: [o for o in frontier if agent in o.acting] for agent in agents}",
        "asked = {agent: list(frontier) for agent in agents}",
        ("tests/test_turn_based.py::test_trees_branch_on_the_acting_agents_only",),
    ),
    Mutant(
        "turn-based: a TD target bootstraps from the critic's value where the agent does not act",
        "llm_marl/learners/actor_critic/trainer.py",
        "            if child.acts(agent):\n                return float(values[name][row[id(child)], out])",
        "            if True:\n                return float(values[name][row[id(child)], out])",
        ("tests/test_turn_based.py::test_iac_targets_bootstrap_through_the_partners_turn",),
    ),
    Mutant(
        "q critic: action-dependent baseline A = y - Q (the anchor's Q7)",
        "llm_marl/learners/actor_critic/trainer.py",
        "raw = acm.advantages(q_old, baseline)",
        "raw = acm.advantages(targets, q_old)",
        ("tests/test_actor_critic.py::test_q_critic_advantage_is_action_value_minus_state_value",),
    ),
    Mutant(
        "value clipping ignored",
        "llm_marl/learners/actor_critic/math.py",
        "    if clip_range is None:\n        return errors\n",
        "    if True:\n        return errors\n",
        ("tests/test_actor_critic.py::test_value_clipping_applies_to_a_separate_critic",),
    ),
    Mutant(
        "MAAC reads every agent's value from output 0 (the anchor's Q8)",
        "llm_marl/learners/actor_critic/trainer.py",
        'return "critic", self.agent_ids.index(agent)',
        'return "critic", 0',
        ("tests/test_actor_critic.py::test_t7_maac_bootstraps_each_agent_from_its_own_output_of_the_joint_value",),
    ),
    Mutant(
        "whitening with the sample std",
        "llm_marl/learners/actor_critic/math.py",
        "x.std(correction=0)",
        "x.std()",
        ("tests/test_actor_critic_math.py::test_t2_whitening_uses_the_population_std_and_leaves_a_single_sample",),
    ),
    Mutant(
        "central critic loss summed over agents instead of averaged",
        "llm_marl/learners/actor_critic/trainer.py",
        "torch.zeros((), dtype=torch.float64)) / max(total, 1)",
        "torch.zeros((), dtype=torch.float64))",
        ("tests/test_actor_critic.py::test_central_critic_takes_one_step_per_joint_minibatch_on_every_agents_output",),
    ),
    Mutant(
        "LM critic reads the value one token early",
        "llm_marl/policies/lm_critic.py",
        "hidden = self.runner.forward(inputs, self._routes(len(rows))).hidden_states[-1][:, -1]",
        "hidden = self.runner.forward(inputs, self._routes(len(rows))).hidden_states[-1][:, -2]",
        ("tests/test_lm_critic.py::test_state_value_is_read_at_the_last_prompt_token",),
    ),
    Mutant(
        "checkpoints do not restore the critics",
        "llm_marl/runs/checkpoint.py",
        "        extra.load_state_dict(torch.load(file, weights_only=False))\n",
        "        pass\n",
        ("tests/test_actor_critic.py::test_stop_resume_equals_uninterrupted_with_critics_and_their_optimizers",),
    ),
    Mutant(
        "shared placement: the value loss is left out of the actor's step",
        "llm_marl/learners/actor_critic/trainer.py",
        "            loss = loss + self._value_loss_sum(agent, batch).to(loss.device)\n",
        "            pass\n",
        ("tests/test_actor_critic.py::test_shared_placement_takes_one_step_on_the_sum_at_the_actor_rate",),
    ),
    # --- issue 12: CoMLRL scripts (llm_marl.comlrl, W&B, default run directory, scoring fix) ----------
    Mutant(
        "shared-prompt scoring numbers padding on past the answer's end",
        "llm_marl/policies/scoring.py",
        '        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)\n        inputs["position_ids"] = positions[:, prompt_mask.shape[1] :]',
        '        start = prompt_mask.sum(-1)[index].unsqueeze(1)\n        inputs["position_ids"] = start + torch.arange(targets.shape[1] - 1, device=start.device)',
        ("tests/test_scoring_context_limit.py",),
    ),
    Mutant(
        "RewardProcessors.shift subtracts",
        "llm_marl/comlrl/utils/reward_processor.py",
        "return reward + value",
        "return reward - value",
        ("tests/test_comlrl_compat.py::test_scale_multiplies_and_shift_adds",),
    ),
    Mutant(
        "reward caller counts batch_items as a positional slot (CoMLRL 1.4.3 aligned mode)",
        "llm_marl/tasks/function_task.py",
        'if p.name != "batch_items" and (p.name != "prompts" or i == 0)]',
        'if p.name != "prompts" or i == 0]',
        ("tests/test_comlrl_compat.py::test_reward_forms_two_agents",),
    ),
    Mutant(
        "1.4.2-form eval loggers are called in the 1.4.3 form",
        "llm_marl/comlrl/anchor_compat.py",
        'legacy = ("test_cases" in params or "entry_points" in params) and "batch_items" not in params',
        "legacy = False",
        ("tests/test_comlrl_compat.py::test_eval_logger_forms_are_chosen_from_the_signature",),
    ),
    Mutant(
        "a one-entry agent_devices is not for every agent",
        "llm_marl/learners/config.py",
        "setattr(self, name, devices * self.num_agents if len(devices) == 1 else devices)",
        "setattr(self, name, devices)",
        ("tests/test_comlrl_compat.py::test_one_device_entry_is_for_every_agent",),
    ),
    Mutant(
        "CoMLRL-style MAGRPO config keeps weight decay 0 (CoMLRL's AdamW has 0.01)",
        "llm_marl/comlrl/trainers/reinforce/magrpo.py",
        "weight_decay: float = ADAMW_DEFAULT_WEIGHT_DECAY",
        "weight_decay: float = 0.0",
        ("tests/test_comlrl_compat.py::test_comlrl_configs_default_to_the_optimizer_comlrl_builds",),
    ),
    Mutant(
        "metrics never reach the W&B run",
        "llm_marl/runs/logging.py",
        "        for mirror in self.mirrors:\n",
        "        for mirror in []:\n",
        ("tests/test_comlrl_compat.py::test_report_to_wandb_sends_the_same_metrics",),
    ),
    Mutant(
        "no default run directory without output_dir",
        "llm_marl/comlrl/anchor_compat.py",
        "    if args.output_dir is None:\n        name =",
        "    if False:\n        name =",
        ("tests/test_comlrl_compat.py::test_no_output_dir_gets_a_named_default_run_directory",),
    ),
    # --- where features meet (issue 22) -------------------------------------------------------------
    Mutant(
        "a checkpointed layer recomputes without the routing of its own forward",
        "llm_marl/policies/lora_team.py",
        'options = {"use_reentrant": False, "context_fn": self.runner.checkpoint_contexts}',
        'options = {"use_reentrant": False}',
        ("tests/test_lora_team.py::test_gradient_checkpointing_with_chunked_scoring_gives_the_gradients_of_one_pass",),
    ),
    Mutant(
        "a team's critic reads through peft's active adapter (agent 0's)",
        "llm_marl/policies/adapter_critic.py",
        "    def _routes(self, rows: int) -> list[str]:\n        return [self.adapter] * rows",
        "    def _routes(self, rows: int) -> list[str]:\n        return [self.team.agents[0]] * rows",
        ("tests/test_team_critics.py",),
    ),
    Mutant(
        "a separate critic of a team copies the whole model",
        "llm_marl/learners/actor_critic/trainer.py",
        "            if isinstance(policy, AdapterPolicy):  # on the team's one base",
        "            if False:  # on the team's one base",
        ("tests/test_team_critics.py::test_separate_critics_are_value_adapters_on_the_same_base",),
    ),
    Mutant(
        "value heads ignore the trainer's seed",
        "llm_marl/policies/lm_critic.py",
        "ValueHead(hidden_size_of(model), num_outputs, hidden_dim, seed=seed)",
        "ValueHead(hidden_size_of(model), num_outputs, hidden_dim)",
        ("tests/test_lm_critic.py::test_value_heads_follow_the_trainer_seed_not_the_global_rng",),
    ),
    Mutant(
        "an identical checkpoint counts as a conflict",
        "llm_marl/runs/checkpoint.py",
        "    if files[0] != files[1]:\n        return False",
        "    if True:\n        return False",
        ("tests/test_run_folder.py::test_resuming_a_finished_run_re_saves_its_last_checkpoint_without_a_copy",),
    ),
    Mutant(
        "a drop-in run writes its closing checkpoint unasked",
        "llm_marl/runs/checkpoint.py",
        "return trainer.args.output_dir is not None and trainer.args.save_final_checkpoint is not False",
        "return trainer.args.output_dir is not None",
        ("tests/test_unasked_weights.py",),
    ),
    # --- the preference learners (issue 25) ----------------------------------------------------------
    Mutant(
        "MADPO: each agent's DPO loss on its own margin, not the team's sum",
        "llm_marl/learners/preference/madpo.py",
        "losses = pm.joint_dpo_losses(all_margins, self.args.dpo_beta)",
        "losses = sum(pm.joint_dpo_losses(all_margins[i : i + 1], self.args.dpo_beta) for i in range(len(all_margins)))",
        ("tests/test_preference.py::test_joint_dpo_loss_and_per_agent_gradients_on_a_tabular_team",),
    ),
    Mutant(
        "MADPO margins ignore the frozen reference",
        "llm_marl/learners/preference/madpo.py",
        "pm.dpo_margins(lp_w, lp_l, ref_w, ref_l).to(row.device)",
        "pm.dpo_margins(lp_w, lp_l, None, None).to(row.device)",
        ("tests/test_preference.py::test_joint_dpo_loss_and_per_agent_gradients_on_a_tabular_team",),
    ),
    Mutant(
        "MADPO leaves fixed partners' margins out of the joint margin",
        "llm_marl/learners/preference/madpo.py",
        "all_margins = torch.cat([margins, fixed[None]])",
        "all_margins = margins",
        ("tests/test_preference.py::test_a_fixed_partner_enters_the_joint_margin_without_being_trained",),
    ),
    Mutant(
        "preference pairs reversed (the loser preferred)",
        "llm_marl/learners/preference/math.py",
        "return [(i, j) for _, i, j in pairs]",
        "return [(j, i) for _, i, j in pairs]",
        ("tests/test_preference.py::test_madpo_beats_a_shuffled_label_control_on_the_climbing_game",),
    ),
    Mutant(
        "reward_gap pair selection takes the smallest gaps first",
        "llm_marl/learners/preference/math.py",
        "pairs.sort(key=lambda p: -p[0])  # stable",
        "pairs.sort(key=lambda p: p[0])  # stable",
        ("tests/test_preference.py::test_pair_selection_reward_gap_takes_largest_gaps_first_ties_in_order",),
    ),
    Mutant(
        "Bradley-Terry loss with winner and loser swapped",
        "llm_marl/learners/preference/reward_model.py",
        "chosen, rejected = scores[: len(pairs)], scores[len(pairs) :]",
        "rejected, chosen = scores[: len(pairs)], scores[len(pairs) :]",
        ("tests/test_preference_rlhf.py::test_bradley_terry_step_of_the_reward_model_by_hand",),
    ),
    Mutant(
        "MARLHF's RL phase trains on the env's reward, not the reward model's",
        "llm_marl/learners/preference/reward_model.py",
        "node.rewards, node.returns, node.agent_rewards = list(values), list(values), None",
        "pass",
        ("tests/test_preference_rlhf.py::test_reward_model_ranks_held_out_joint_answers_and_rl_against_it_beats_a_shuffled_label_control",),
    ),
    Mutant(
        "MARLHF refits its reward model after a resume",
        "llm_marl/learners/preference/reward_model.py",
        "        if not self.reward_phase.done:\n            self._learn_reward_model()",
        "        if True:\n            self._learn_reward_model()",
        ("tests/test_preference_rlhf.py::test_stop_resume_equals_uninterrupted_without_refitting_the_reward_model",),
    ),
    Mutant(
        "reward model without position ids: a score moves with its batch neighbours (issue 34.1)",
        "llm_marl/learners/preference/reward_model.py",
        "        if self.takes_position_ids:\n            inputs[\"position_ids\"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)\n        hidden = self.backbone",
        "        hidden = self.backbone",
        ("tests/test_reward_model_inputs.py::test_a_text_scores_the_same_alone_and_next_to_longer_ones",),
    ),
    Mutant(
        "reward model cuts the joint text from the right, answers first (issue 34.2)",
        "llm_marl/learners/preference/reward_model.py",
        "    if limit is None or total <= limit:\n        return [t for _, ids in pieces for t in ids]",
        "    if True:\n        return [t for _, ids in pieces for t in ids][:limit]",
        ("tests/test_reward_model_inputs.py::test_reward_max_length_keeps_the_answers",),
    ),
    Mutant(
        "a bf16 agent's default reward model stays bf16 (issue 34.3)",
        "llm_marl/learners/preference/reward_model.py",
        "            backbone.float()  # trained in float32",
        "            pass  # trained in float32",
        ("tests/test_reward_model_inputs.py::test_a_bf16_agents_default_reward_model_trains_in_float32",),
    ),
    Mutant(
        "MARLHF with an actor-critic phase averages per-agent rewards (issue 34.4)",
        "llm_marl/learners/preference/reward_model.py",
        '(trainer_class.config_class, learner.config_class), {"per_agent_rewards": False})',
        "(trainer_class.config_class, learner.config_class), {})",
        ("tests/test_reward_model_inputs.py::test_marlhf_with_an_actor_critic_rl_phase_refuses_per_agent_rewards",),
    ),
    Mutant(
        "an agent's LM critic reads str(observation), not its actor's templated prompt (issue 34.5)",
        "llm_marl/policies/lm_critic.py",
        "        if self.encode_prompt is not None:",
        "        if False:",
        ("tests/test_same_inputs.py",),
    ),
    Mutant(
        "reward-model fits log at step 0 again every round (issue 34.6)",
        "llm_marl/learners/preference/reward_model.py",
        '"reward_model/pairs": float(len(pairs))}, self.state.batch_step)',
        '"reward_model/pairs": float(len(pairs))}, 0)',
        ("tests/test_preference_iter.py::test_log_steps_never_go_back_across_rounds",),
    ),
    Mutant(
        "MADPOIter trains a whole round past max_steps (issue 34.7)",
        "llm_marl/learners/preference/iterative.py",
        "            if self._reached_max_steps():\n                self.rounds.cut",
        "            if False:\n                self.rounds.cut",
        ("tests/test_preference_iter.py::test_madpo_iter_stops_at_max_steps_inside_a_round_and_resumes_exactly",),
    ),
    Mutant(
        "an update steps past max_steps (issue 34.7, every learner)",
        "llm_marl/learners/update.py",
        "            if self._reached_max_steps():  # the rest stays planned",
        "            if False:  # the rest stays planned",
        ("tests/test_max_steps.py::test_stops_at_exactly_max_steps[magrpo]", "tests/test_max_steps.py::test_stops_at_exactly_max_steps[iac]"),
    ),
    Mutant(
        "the rest of an update cut by max_steps is planned anew (actor-critic re-whitens what is left)",
        "llm_marl/learners/update.py",
        'plan, self._update_plan = getattr(self, "_update_plan", None), None',
        "plan, self._update_plan = None, None",
        ("tests/test_max_steps.py::test_every_cut_point_resumes_exactly",),
    ),
    Mutant(
        "a checkpoint forgets the batch that max_steps cut (resume collects it again)",
        "llm_marl/runs/checkpoint.py",
        "    plan, unfinished = getattr(trainer, \"_update_plan\", None), _cut_batch(trainer)\n",
        "    plan, unfinished = getattr(trainer, \"_update_plan\", None), None\n",
        ("tests/test_max_steps.py::test_stopped_then_resumed_equals_uninterrupted[magrpo]",),
    ),
    Mutant(
        "the reward model starts in train mode (issue 34.8)",
        "llm_marl/learners/preference/reward_model.py",
        "                p.requires_grad_(False)\n        self.eval()",
        "                p.requires_grad_(False)",
        ("tests/test_reward_model_inputs.py::test_the_reward_model_is_in_eval_mode_except_while_it_is_fit",),
    ),
    Mutant(
        "iterative comparison pairs ordered by gap under comparator_reward",
        "llm_marl/learners/preference/math.py",
        "found.sort(key=lambda p: (-p[1], -p[0]))",
        "found.sort(key=lambda p: -p[0])",
        ("tests/test_preference_iter.py::test_comparison_pairs_per_mode_by_hand",),
    ),
    Mutant(
        "centralized env gives every role the whole joint answer",
        "llm_marl/learners/reinforce/centralized.py",
        "roles = self.split(actions[self.actor])",
        "roles = [actions[self.actor]] * len(self.roles)",
        ("tests/test_preference_centralized.py::test_the_joint_answer_is_split_per_role_for_the_shared_reward",),
    ),
    # --- packed weights for CPU decoding (issue 24) -----------------------------------------------
    Mutant(
        "a pack is reused after its weight changed (stale weights decode)",
        "llm_marl/policies/packed_weights.py",
        "if held is not None and held[0] == stamp:",
        "if held is not None:",
        ("tests/test_packed_weights.py",),
    ),
    Mutant(
        "trainable weights' packs are held between calls (a full model's memory grows)",
        "llm_marl/policies/packed_weights.py",
        "if layer.weight.requires_grad or id(layer) in self._changed:",
        "if id(layer) in self._changed:",
        ("tests/test_packed_weights.py",),
    ),
    Mutant(
        "the packed fp32 kernel serves any row count, not the one it was packed for",
        "llm_marl/policies/packed_weights.py",
        "lambda rows, call_rows: rows == call_rows, 2, True),",
        "lambda rows, call_rows: True, 2, True),",
        ("tests/test_packed_weights.py",),
    ),
    # --- bf16 on any CPU, threads under load (issue 32) -----------------------------------------------
    Mutant(
        "bf16 layers are packed whether or not the CPU runs oneDNN's bf16 kernels",
        "llm_marl/policies/packed_weights.py",
        "if dtype == torch.bfloat16 and not cpu.bf16_support().runs:",
        "if False:",
        ("tests/test_packed_weights.py",),
    ),
    Mutant(
        "the thread governor changes the count on one check (no hysteresis)",
        "llm_marl/threads.py",
        "        elif at_once or wanted == self._pending:",
        "        elif True:",
        ("tests/test_threads.py::test_one_noisy_interval_changes_nothing",),
    ),
    Mutant(
        "the thread governor's first check, against the import-time reading, waits for a second one",
        "llm_marl/threads.py",
        "        elif at_once or wanted == self._pending:",
        "        elif wanted == self._pending:",
        ("tests/test_threads.py::test_the_first_check_against_a_reading_from_before_the_models_loaded_acts_at_once",),
    ),
    Mutant(
        "the thread governor counts this process's own CPU time as other work's",
        "llm_marl/threads.py",
        "self.others = max(0.0, (busy - own) / self._hz / elapsed)",
        "self.others = max(0.0, busy / self._hz / elapsed)",
        ("tests/test_threads.py::test_a_busy_neighbour_takes_one_thread_away_and_its_end_gives_it_back",),
    ),
    Mutant(
        "a CPU counts as taken only when other work uses all of it",
        "llm_marl/threads.py",
        "    taken = int(round(others + 1.0 - TAKEN_AT, 9))",
        "    taken = int(others)",
        ("tests/test_threads.py::test_a_busy_neighbour_takes_one_thread_away_and_its_end_gives_it_back",),
    ),
    Mutant(
        "a thread count fixed by OMP_NUM_THREADS (torchrun's per-rank choice) is governed",
        "llm_marl/cpu.py",
        '        if os.environ.get(name, "").strip():',
        "        if False:",
        ("tests/test_threads.py::test_a_fixed_count_is_not_governed",),
    ),
    Mutant(
        "a second trainer keeps the count an earlier run's thread governor lowered (never governed again)",
        "llm_marl/cpu.py",
        "        torch.set_num_threads(previous.ceiling)",
        "        pass",
        ("tests/test_threads.py::test_a_trainer_run_beside_a_busy_process_drops_to_one_thread",),
    ),
    Mutant(
        "optimizer steps do not let the thread governor check",
        "llm_marl/threads.py",
        "register_optimizer_step_post_hook(lambda optimizer, args, kwargs: tick())",
        "register_optimizer_step_post_hook(lambda optimizer, args, kwargs: None)",
        ("tests/test_threads.py::test_a_trainer_run_beside_a_busy_process_drops_to_one_thread",),
    ),
    Mutant(
        "the sampler's decoding loop does not let the thread governor check",
        "llm_marl/policies/sampling.py",
        "        threads.tick()  # torch's thread count",
        "        pass  # torch's thread count",
        ("tests/test_threads.py::test_the_samplers_decoding_loop_ticks_once_per_token",),
    ),
    Mutant(
        "a team batches only agents whose every setting matches (system prompts split the loop)",
        "llm_marl/policies/lora_team.py",
        "same = all(getattr(self.policies[a], s) == getattr(first, s) for a in agents for s in SHARED_SAMPLING)",
        "same = all(self.policies[a].settings() == first.settings() for a in agents)",
        ("tests/test_chat_template.py::test_team_agents_with_their_own_system_prompts_share_one_decode_loop",),
    ),
    Mutant(
        "the lm head gets HF's sliced hidden states as they are (a batched matmul copying its weight per row)",
        "llm_marl/policies/lm_runner.py",
        "    return (x.contiguous().view(x.shape), *args[1:])",
        "    return None",
        ("tests/test_causal_lm_policy.py::test_lm_head_gets_its_sliced_input_as_a_fresh_tensor",),
    ),
    Mutant(
        "the bf16 copy trusts torch's _version alone (a fused AdamW step is missed)",
        "llm_marl/policies/lm_runner.py",
        "if stamp != self._stamps[index] or last_change(parameter) > seen:",
        "if stamp != self._stamps[index]:",
        ("tests/test_sampler_freshness.py",),
    ),
    Mutant(
        "a held pack ignores change notices",
        "llm_marl/policies/packed_weights.py",
        "stamp = (last_change(weight), weight._version,",
        "stamp = (0, weight._version,",
        ("tests/test_sampler_freshness.py::test_a_held_pack_is_made_again_after_a_change_notice",),
    ),
    Mutant(
        "a broadcast announces no weight change",
        "llm_marl/runs/distributed.py",
        "        weights_changed(parameters)\n",
        "",
        ("tests/test_sampler_freshness.py::test_a_broadcast_refreshes_the_copy",),
    ),
    Mutant(
        "dropout stays on in train-mode scoring (gradient checkpointing)",
        "llm_marl/policies/causal_lm.py",
        "        if disable_dropout:\n            _switch_off_dropout(model)",
        "        if False:\n            _switch_off_dropout(model)",
        ("tests/test_checkpointing_dropout.py",),
    ),
    Mutant(
        "the sampler gap counts answers sampled before a weight change",
        "llm_marl/policies/base.py",
        "rows = [i for i in rows if completions[i].sampler.epoch >= changed]",
        "rows = rows",
        ("tests/test_sampler_gap.py::test_the_meter_counts_only_the_samplers_own_answers_scored_with_its_sampling_weights",),
    ),
    Mutant(
        "the sampler's recorded log-probs are untempered (the scorer's are tempered)",
        "llm_marl/policies/causal_lm.py",
        "    scaled = logits.float() / temperature\n    return scaled.gather",
        "    scaled = logits.float()\n    return scaled.gather",
        ("tests/test_sampler_gap.py::test_an_lm_run_logs_a_rounding_sized_fp32_gap_and_a_bounded_bf16_gap",),
    ),
    Mutant(
        "max_sampler_gap never stops a run",
        "llm_marl/learners/update.py",
        "if limit is not None and gap > limit:",
        "if limit is not None and gap > 1e9:",
        ("tests/test_sampler_gap.py::test_max_sampler_gap_stops_the_run_before_the_step",),
    ),
    Mutant(
        "llm-marl --help, list and models import the learner's trainer to build its flags (torch loads)",
        "llm_marl/cli.py",
        'config_class = learner_config(learner) if command in ("train", "eval") or not argv else None',
        "config_class = learner_classes(learner)[0]",
        ("tests/test_first_hour.py::test_listing_commands_do_not_import_torch",),
    ),
    Mutant(
        "a missing --model folder or a malformed --actions menu is refused only after torch loads",
        "llm_marl/cli.py",
        "    check_policy_flags(options)\n    _import_modules(",
        "    _import_modules(",
        ("tests/test_cli.py::test_usage_errors_come_before_torch_loads",),
    ),
    Mutant(
        "a learner family's tiny defaults keep the REINFORCE-only fields",
        "llm_marl/cli.py",
        "    for name in FOREIGN_FIELDS[family]:\n        options.pop(name, None)",
        "    for name in FOREIGN_FIELDS[family]:\n        pass",
        ("tests/test_tiny_learners.py::test_each_learners_tiny_defaults_make_a_valid_config_of_its_own_family",),
    ),
    Mutant(
        "a resumed run's summary forgets the run's first evaluation",
        "llm_marl/cli.py",
        "    elif main_rank and os.path.isfile(os.path.join(run_dir, EVAL_BEFORE_FILE)):",
        "    elif False:",
        ("tests/test_cli.py::test_a_resumed_runs_summary_has_before_after_both_batch_counts_and_the_prompts",),
    ),
    Mutant(
        "--env module:attr does not look in the current folder",
        "llm_marl/envs/registry.py",
        '    if here not in sys.path and "" not in sys.path:',
        "    if False:",
        ("tests/test_cli.py::test_an_env_module_in_the_current_folder_is_found_as_python_m_finds_it",),
    ),
    Mutant(
        "saved folders are agent_i again, not the agents' names",
        "llm_marl/runs/run_dir.py",
        "    if plain and len({name.lower() for name in names}) == len(names):\n        return names",
        "    if plain and len({name.lower() for name in names}) == len(names):\n        return [f\"agent_{i}\" for i in range(len(names))]",
        ("tests/test_first_hour.py::test_saved_folders_use_the_agents_names_and_old_agent_i_folders_still_read",),
    ),
    Mutant(
        "an evaluation's bar moves only when a batch ends",
        "llm_marl/policies/sampling.py",
        "        if progress._LISTENERS:  # an evaluation's bar follows the tokens",
        "        if False:  # an evaluation's bar follows the tokens",
        ("tests/test_progress.py::test_an_evaluation_counts_items_done_of_total_while_one_batch_decodes",),
    ),
    # --- fsdp=True (issue 37) --------------------------------------------------------------------
    Mutant(
        "fsdp: a LoRA team's adapters sharded with its base (not whole on every rank)",
        "llm_marl/runs/fsdp.py",
        "team.model.get_base_model(), mesh, f\"team {team.name!r}'s base\", ignored=adapters, frozen=True, mixed=mixed)",
        "team.model.get_base_model(), mesh, f\"team {team.name!r}'s base\", ignored=None, frozen=True, mixed=mixed)",
        ("tests/test_fsdp.py::test_two_sharded_ranks_train_like_one_unsharded_process",),
    ),
    Mutant(
        "fsdp: a LoRA team's adapters left out of checkpoints",
        "llm_marl/runs/checkpoint.py",
        "        if agent in sharded and not sharded[agent].frozen:\n            continue",
        "        if agent in sharded:\n            continue",
        ("tests/test_fsdp.py::test_two_sharded_ranks_train_like_one_unsharded_process",),
    ),
    Mutant(
        "fsdp: a critic's whole value head counted once per rank in the gradient norm",
        "llm_marl/runs/fsdp.py",
        "    for g in grads:\n        if is_sharded(g):\n            total += g.to_local()",
        "    for g in grads:\n        if True:\n            total += (g.to_local() if is_sharded(g) else g)",
        ("tests/test_fsdp.py::test_two_sharded_ranks_train_like_one_unsharded_process",),
    ),
    Mutant(
        "fsdp: sharded critics left out of checkpoints",
        "llm_marl/runs/checkpoint.py",
        "        for folder, shard, optimizer in _critic_shards(trainer):\n            save_shards(",
        "        for folder, shard, optimizer in _critic_shards(trainer)[:0]:\n            save_shards(",
        ("tests/test_fsdp.py::test_sharded_critics_resume_exactly_and_maac_and_a_team_train_like_one_process",),
    ),
    Mutant(
        "fsdp: mixed_precision=True ignored (fp32 gathers)",
        "llm_marl/runs/fsdp.py",
        "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed",
        "MixedPrecisionPolicy() if mixed",
        ("tests/test_fsdp.py::test_two_sharded_ranks_train_like_one_unsharded_process",),
    ),
    Mutant(
        "fsdp: a value head on an agent's own sharded model left out of the agent's checkpoint shards",
        "llm_marl/runs/fsdp.py",
        "            owner.checkpointed = torch.nn.ModuleDict({\"model\": owner.model, \"head\": critic.head})",
        "            pass",
        ("tests/test_fsdp.py::test_sharded_critics_resume_exactly_and_maac_and_a_team_train_like_one_process",),
    ),
    Mutant(
        "fsdp: fsdp_gather=\"layer\" ignored (whole models gathered to sample)",
        "llm_marl/runs/fsdp.py",
        "    if models and getattr(trainer.args, \"fsdp_gather\", \"model\") == \"layer\":",
        "    if models and getattr(trainer.args, \"fsdp_gather\", \"model\") == \"lay\":",
        ("tests/test_fsdp.py::test_two_sharded_ranks_train_like_one_unsharded_process",),
    ),
    Mutant(
        "fsdp: MARLHF's sharded reward model steps on the sum of the ranks' identical gradients",
        "llm_marl/runs/fsdp.py",
        "                p.grad.div_(trainer.dist.world_size)",
        "                p.grad.div_(1)",
        ("tests/test_fsdp.py::test_sharded_critics_resume_exactly_and_maac_and_a_team_train_like_one_process",),
    ),
    # --- issue 42: CoMLRL's own suite on llm_marl --------------------------------------------------
    Mutant(
        "a generate stub set on the model is ignored: the decode loop samples",
        "llm_marl/policies/causal_lm.py",
        '        return "generate" in getattr(self.model, "__dict__", {})',
        "        return False",
        ("tests/test_generate_stub.py",),
    ),
    Mutant(
        "read_checkpoint_metadata reports dataset batches, not the checkpoint's optimizer step",
        "llm_marl/comlrl/utils/checkpoint.py",
        '"sequence": int(saved["state"]["global_step"]),',
        '"sequence": int(saved["state"]["batch_step"]),',
        ("tests/test_comlrl_public_names.py::test_read_checkpoint_metadata_reads_an_llm_marl_checkpoint",),
    ),
    # --- models off the CPU (issue 46) ------------------------------------------------------------------
    Mutant(
        "packed weights: layers off the CPU are packed with MKL/oneDNN (a model on cuda)",
        "llm_marl/policies/packed_weights.py",
        "            and m.weight.device.type == \"cpu\"\n",
        "            and m.weight.device.type != \"mps\"\n",
        ("tests/test_devices.py::test_weights_are_packed_only_on_the_cpu",),
    ),
    Mutant(
        "the CPU bf16 fallback warning is given for a bf16 model on a GPU",
        "llm_marl/policies/causal_lm.py",
        "    on_cpu = any(p.device.type == \"cpu\" for p in params)",
        "    on_cpu = bool(params)",
        ("tests/test_devices.py::test_the_bf16_fallback_warning_is_only_for_bf16_on_the_cpu",),
    ),
    Mutant(
        "torchrun on CUDA joins an NCCL-only process group (the trainers' CPU collectives fail)",
        "llm_marl/runs/distributed.py",
        "    return \"cpu:gloo,cuda:nccl\" if cuda_available else \"gloo\"",
        "    return \"nccl\" if cuda_available else \"gloo\"",
        ("tests/test_devices.py::test_the_process_group_takes_cpu_tensors_beside_cuda_ones",),
    ),
    Mutant(
        "fsdp=True at one torchrun rank is refused (a single GPU cannot shard)",
        "llm_marl/runs/fsdp.py",
        "        if not launched_by_torchrun():",
        "        if True:",
        ("tests/test_devices.py::test_fsdp_at_one_torchrun_rank_shards_over_a_group_of_one_and_trains_like_no_fsdp",),
    ),
    Mutant(
        "serve: a seeded request draws from the global RNG",
        "llm_marl/serve/batch.py",
        "generators = {id(job): torch.Generator().manual_seed(job.seed % 2**64) for job in jobs if job.seed is not None}",
        "generators = {}",
        ("tests/test_serve.py::test_seed_repeats_an_answer_and_n_answers_differ",),
    ),
    Mutant(
        "serve: the scheduler decodes one request at a time",
        "llm_marl/serve/scheduler.py",
        "if same and (not batch or rows + job.rows <= self.max_batch_rows):",
        "if same and not batch:",
        ("tests/test_serve.py::test_concurrent_requests_are_decoded_in_one_batch",),
    ),
    Mutant(
        "serve: a stop string is kept in the answer",
        "llm_marl/serve/batch.py",
        "text, row.finish = text[:cut], \"stop\"",
        "row.finish = \"stop\"",
        ("tests/test_serve.py::test_stop_cuts_the_answer_before_the_stop_string",),
    ),
    Mutant(
        "every rank resumes rank 0's buffers and generators (issue 43)",
        "llm_marl/runs/checkpoint.py",
        "        return os.path.join(path, rank_folder(dist.rank))\n",
        "        return path\n",
        ("tests/test_distributed_resume.py::test_two_ranks_stopped_with_partly_filled_buffers_resume_exactly",),
    ),
    Mutant(
        "an answer drawn by older weights counts as fresh (sampler_staleness always 0, issue 43)",
        "llm_marl/learners/staleness.py",
        "self.version(agent, record.epoch) - self.version(agent, record.weights))",
        "0)",
        ("tests/test_sampler_staleness.py::test_a_sampler_one_step_behind_stops_an_on_policy_run",),
    ),
]

def run_one(mutant: Mutant, timeout: float) -> tuple[str, str, float]:
    """(status, detail, seconds) of one mutant: killed, survived, stale or timeout."""
    path = os.path.join(REPO, mutant.file)
    if not os.path.exists(path):
        return "stale", f"{mutant.file} does not exist", 0.0
    source = open(path).read()
    count = source.count(mutant.original)
    if count != 1:
        return "stale", f"original snippet found {count} times in {mutant.file}", 0.0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        copy = os.path.join(tmp, "repo")
        shutil.copytree(REPO, copy, ignore=IGNORED, symlinks=True)
        with open(os.path.join(copy, mutant.file), "w") as f:
            f.write(source.replace(mutant.original, mutant.mutated))
        env = {**os.environ, "PYTHONPATH": copy, "PYTHONDONTWRITEBYTECODE": "1"}
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests]
        try:
            result = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "timeout", f"tests ran past {timeout:.0f} s", time.monotonic() - started
    seconds = time.monotonic() - started
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else result.stderr.strip().splitlines()[-1:]
    if result.returncode == 0:
        return "survived", str(summary), seconds
    if result.returncode in (1, 2):  # tests failed, or a collection error the mutant caused
        failed = next((line for line in lines if line.startswith("FAILED")), str(summary))
        return "killed", failed, seconds
    return "error", f"pytest exit code {result.returncode}: {summary}", seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", action="append", default=[], help="only mutants whose name contains this (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--check", action="store_true", help="only report stale mutants; run no tests")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutant's tests (default 900)")
    options = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not options.k or any(k.lower() in m.name.lower() for k in options.k)]
    if options.list:
        for m in chosen:
            print(f"{m.name}\n    {m.file}  ->  {' '.join(m.tests)}")
        return 0
    if options.check:
        stale = 0
        for m in chosen:
            text = open(os.path.join(REPO, m.file)).read() if os.path.exists(os.path.join(REPO, m.file)) else ""
            if text.count(m.original) != 1:
                stale += 1
                print(f"STALE  {m.name}: original found {text.count(m.original)} times in {m.file}")
        print(f"{len(chosen) - stale}/{len(chosen)} mutants apply")
        return 1 if stale else 0
    counts: dict[str, int] = {}

    def report(item: tuple[Mutant, tuple[str, str, float]]) -> None:
        mutant, (status, detail, seconds) = item
        counts[status] = counts.get(status, 0) + 1
        print(f"{status.upper():9} {seconds:6.1f}s  {mutant.name}\n          {detail}", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        for item in zip(chosen, pool.map(lambda m: run_one(m, options.timeout), chosen)):
            report(item)
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    total = len(chosen)
    print(
        f"\nmutation score: {killed}/{total} killed ({100 * killed / max(total, 1):.0f}%); "
        + ", ".join(f"{status} {n}" for status, n in sorted(counts.items()))
    )
    return 0 if killed == total else 1


if __name__ == "__main__":
    sys.exit(main())
