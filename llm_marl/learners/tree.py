"""K-branch rollout trees (docs/algorithms.md §3).

One tree per dataset item; a node is one turn of one branch. Trees grow level by level: at each
depth every agent makes ONE policy call over the observations of all open nodes of all trees,
asking for K answers each. Joint actions are the K aligned tuples or the K^N cross product; every
joint action earns the shared reward, and — unless the node is early-terminated, on the last
turn, or its branch ended — gets a child holding the env's next observations. Returns are
computed bottom-up with discount gamma.

Transitions run only for branches that get a child: an env with ``step_rewards`` and ``advance``
(:class:`~llm_marl.envs.DialogueEnv`) scores all joint actions of a node first (batched), and
only the expanded ones are advanced, so an early-terminated node, the last turn and ended
branches cost no transition. Other envs are stepped eagerly, one fork per joint action
(``step_branches`` where they have it), since their ``step`` does both at once.

Randomness: with a ``seed``, every node gets its own seed derived from (seed, item index, path of
joint-action indices from the root), and policies whose ``sample`` accepts ``generators=`` (e.g.
:class:`~llm_marl.policies.TabularPolicy`) draw each node's answers from a generator seeded by it
and the agent's position. A tree then depends only on the seed and its item, not on which other
items were rolled out with it, in which order, or on which rank: batched and one-by-one rollouts
give identical trees. Policies without ``generators=`` (language models sampling in one batched
``generate``) use torch's global RNG. Agents of one team of adapters on a shared base
(:class:`~llm_marl.policies.LoRATeam`) are asked together, once per depth: one decode loop
whose rows carry their agent's adapter.

Turn-based turns: only the agents acting at a node answer there (the env's ``acting_agents``
attribute, else its infos' ``"acting_agents"``, else every agent). The others are not asked: the
node's ``completions`` and ``joint`` hold the acting agents only (in agent order), so the tree
branches on them alone, and the learners make no sample, log-probability or gradient of a
non-acting agent at that node. Every agent still gets the node's observation and rewards.

Works on any ``pettingzoo.ParallelEnv``: envs without ``fork()`` are forked with
``copy.deepcopy``; envs without ``step_branches`` are stepped fork by fork. The env passed in is
never stepped itself.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import gymnasium
import torch
from pettingzoo import ParallelEnv

from llm_marl.advantages import discounted_return, should_stop
from llm_marl.policies.base import Completion, Policy
from llm_marl.rollouts import RolloutNode, iter_nodes  # noqa: F401 (re-exported)
from llm_marl.tasks.base import TaskError


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed determined by ``parts`` (stable across processes and Python versions)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _takes_generators(policy: Policy) -> bool:
    try:
        return "generators" in inspect.signature(policy.sample).parameters
    except (TypeError, ValueError):
        return False


def _sample(policy: Policy, observations: list[Any], num_samples: int, seeds: list[int | None]) -> list[list[Completion]]:
    if seeds and seeds[0] is not None and _takes_generators(policy):
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        return policy.sample(observations, num_samples, generators=generators)
    return policy.sample(observations, num_samples)


def sample_agents(
    policies: Mapping[str, Policy],
    observations: Mapping[str, list[Any]],
    num_samples: int,
    seeds: Mapping[str, list[int | None]],
) -> dict[str, list[list[Completion]]]:
    """Every agent's answers to its observations. Agents whose policies belong to one team
    (a ``team`` attribute with ``sample(requests, n)``, e.g. :class:`~llm_marl.policies.LoRATeam`)
    are asked together, in one call; other agents are asked one by one, as before."""
    answers: dict[str, list[list[Completion]]] = {}
    teams: dict[int, tuple[Any, list[str]]] = {}
    for agent in observations:
        team = getattr(policies[agent], "team", None)
        if team is not None and hasattr(team, "sample") and not _takes_generators(policies[agent]):
            teams.setdefault(id(team), (team, []))[1].append(agent)
        else:
            answers[agent] = _sample(policies[agent], observations[agent], num_samples, seeds[agent])
    for team, members in teams.values():
        answers.update(ask_team(policies, members, observations, lambda asked: team.sample(asked, num_samples)))
    return {agent: answers[agent] for agent in observations}


def team_members(policies: Mapping[str, Policy], agents: Sequence[str]) -> dict[str, str]:
    """Env agent -> the name its team knows its policy by (an adapter policy's ``adapter``),
    which need not be the env agent's own name. Two agents on one member of a team would share
    its weights: that raises."""
    names = {agent: str(getattr(policies[agent], "adapter", agent)) for agent in agents}
    seen: dict[str, str] = {}
    for agent, name in names.items():
        if name in seen:
            raise ValueError(f"agents {seen[name]!r} and {agent!r} are given the same team member {name!r} (one adapter): give each agent its own")
        seen[name] = agent
    return names


def ask_team(
    policies: Mapping[str, Policy], agents: Sequence[str], requests: Mapping[str, Any], ask: Callable[[dict[str, Any]], Mapping[str, Any]]
) -> dict[str, Any]:
    """``ask`` (a team's ``sample`` or ``log_probs``) with the ``agents``' requests keyed by the
    names the team knows them by (:func:`team_members`); its answers keyed back by env agent."""
    names = team_members(policies, agents)
    answers = ask({names[agent]: requests[agent] for agent in agents})
    return {agent: answers[names[agent]] for agent in agents}


def acting_of(env: ParallelEnv, infos: Any, agents: Sequence[str], where: str = "") -> list[str]:
    """The agents that act next in ``env``, in the order of ``agents``: the env's
    ``acting_agents`` attribute where it has one, else ``infos``' ``"acting_agents"`` (any agent's),
    else every agent."""
    acting = getattr(env, "acting_agents", None)
    if callable(acting):
        acting = acting()
    if acting is None and isinstance(infos, Mapping):
        for info in infos.values():
            if isinstance(info, Mapping) and "acting_agents" in info:
                acting = info["acting_agents"]
                break
    if acting is None:
        return list(agents)
    unknown = [a for a in acting if a not in agents]
    if unknown or not acting:
        raise ValueError(f"{where}: the env's acting agents {list(acting)} must be a non-empty subset of the policies' agents {list(agents)}")
    return [a for a in agents if a in acting]


def fork_env(env: ParallelEnv) -> ParallelEnv:
    """``env.fork()`` where the env has it, else a deep copy."""
    fork = getattr(env, "fork", None)
    return fork() if fork is not None else copy.deepcopy(env)


def joint_actions(num_answers: int, num_agents: int, mode: str) -> list[tuple[int, ...]]:
    """Joint actions as answer-index tuples: K aligned ones or the K^N cross product."""
    if mode == "aligned" or num_agents == 1:
        return [(k,) * num_agents for k in range(num_answers)]
    if mode in ("cross", "crossed"):
        return list(itertools.product(range(num_answers), repeat=num_agents))
    raise ValueError(f"joint_mode must be 'aligned' or 'cross', got {mode!r}")


def _env_action(space: Any, completion: Completion) -> Any:
    """What the env is sent for an answer: for a ``Discrete`` action space and a completion with a
    menu index (tabular policies), the index offset by ``space.start``; otherwise its text."""
    if isinstance(space, gymnasium.spaces.Discrete) and completion.action is not None:
        return int(space.start) + completion.action
    return completion.text


def _action_space(env: ParallelEnv, agent: str) -> Any:
    """The env's action space of ``agent``, or None where the env defines none."""
    try:
        return env.action_space(agent)
    except (AttributeError, KeyError, NotImplementedError):
        return None


def step_joint(env: ParallelEnv, joint: Sequence[Mapping[str, str]]) -> list[tuple]:
    """Step one fork of ``env`` per joint action; returns (env, obs, rewards, terms, truncs, infos)."""
    step_branches = getattr(env, "step_branches", None)
    if step_branches is not None:
        return [tuple(branch) for branch in step_branches(joint)]
    results = []
    for actions in joint:
        twin = fork_env(env)
        results.append((twin, *twin.step(dict(actions))))
    return results


class _Stepper:
    """One node's joint actions, scored; ``child(j)`` gives branch j's (env, next observations).

    Lazy for envs with ``step_rewards`` + ``advance`` (the transition runs in ``child``), eager
    for the others (every fork is stepped up front)."""

    def __init__(self, env: ParallelEnv, joint: Sequence[Mapping[str, Any]]):
        self.env = env
        self.lazy = callable(getattr(env, "step_rewards", None)) and callable(getattr(env, "advance", None))
        if self.lazy:
            self.scored = env.step_rewards(joint)
            self.results = [tuple(s)[1:5] for s in self.scored]  # rewards, terminations, truncations, infos
        else:
            self.stepped = step_joint(env, joint)
            self.results = [tuple(s)[2:6] for s in self.stepped]

    def child(self, j: int) -> tuple[ParallelEnv, Mapping[str, Any], Any]:
        """Branch j's (env, next observations, infos)."""
        if self.lazy:
            twin, observations, *_, infos = self.env.advance(self.scored[j])
        else:
            twin, observations, *_, infos = self.stepped[j]
        return twin, observations, infos


def shared_reward(rewards: Mapping[str, float], agents: Sequence[str], where: str, learner: str | None = None) -> float:
    values = [float(rewards[a]) for a in agents]
    bad = [(a, v) for a, v in zip(agents, values) if not math.isfinite(v)]
    if bad:  # checked first: NaN != NaN would otherwise be reported as "different rewards"
        raise ValueError(f"{where}: reward of agent {bad[0][0]!r} is {bad[0][1]}, not a finite number")
    if any(v != values[0] for v in values):
        who = f"{learner} uses" if learner else "the learners use"
        family = ("(the preference learners MADPO and MARLHF, whatever their rl_algorithm, rank joint answers by it). Per-agent rewards "
                  "train IAC or MAAC on their own" if learner and learner.startswith(("MADPO", "MARLHF")) else
                  "(the MAGRPO family: MAGRPO, MAREINFORCE, MARLOO, MAReMax). Per-agent rewards train IAC or MAAC")
        raise ValueError(
            f"{where}: agents got different rewards {dict(rewards)}; {who} one shared reward per joint action "
            f"{family}; otherwise give every agent the same reward"
        )
    return values[0]


def _agent_rewards(results: Sequence[Mapping[str, float]], agents: Sequence[str], where: str) -> tuple[list[float], dict[str, list[float]] | None]:
    """Per joint action: the agents' mean reward, and (where any joint action's rewards differ)
    every agent's reward; non-finite rewards raise naming the agent."""
    for rewards in results:
        for a in agents:
            if not math.isfinite(float(rewards[a])):
                raise ValueError(f"{where}: reward of agent {a!r} is {float(rewards[a])}, not a finite number")
    per_agent = {a: [float(rewards[a]) for rewards in results] for a in agents}
    if all(per_agent[a] == per_agent[agents[0]] for a in agents):
        return per_agent[agents[0]], None
    return [sum(per_agent[a][j] for a in agents) / len(agents) for j in range(len(results))], per_agent


@dataclass
class _Open:
    node: RolloutNode
    env: ParallelEnv
    root: RolloutNode
    acting: list[str] = field(default_factory=list)


def grow_trees(
    env: ParallelEnv,
    policies: Mapping[str, Policy],
    indices: Sequence[int],
    *,
    num_samples: int,
    num_turns: int,
    joint_mode: str = "aligned",
    cross_aggregation: str = "sum",
    early_termination_threshold: float | None = None,
    discount: float = 1.0,
    skip_errors: bool = False,
    seed: int | None = None,
    per_agent_rewards: bool = False,
    learner: str | None = None,
    tree_return_aggregation: str = "mean",
    tree_return_temperature: float = 1.0,
) -> list[RolloutNode]:
    """Grow one tree per dataset index; see :func:`collect_trees` for the config-driven form.

    Agents' rewards that differ raise ``ValueError`` (naming ``learner``) unless
    ``per_agent_rewards``; then they are kept in ``RolloutNode.agent_rewards``.

    With ``skip_errors`` a :class:`TaskError` while stepping an item marks that item's root with
    ``error`` and drops its tree; otherwise it is raised with the item and turn in the message.
    """
    agents = list(policies)
    roots: list[RolloutNode] = []
    frontier: list[_Open] = []
    for n, index in enumerate(indices):
        twin = fork_env(env)
        options = {"index": int(index)}
        observations, infos = twin.reset(options=options)
        root = RolloutNode(0, int(index), dict(observations), cross_aggregation=cross_aggregation)
        root.seed = None if seed is None else derive_seed(seed, int(index))
        roots.append(root)
        frontier.append(_Open(root, twin, root, acting_of(twin, infos, agents, f"item {index}, turn 0")))

    for depth in range(num_turns):
        if not frontier:
            break
        for open_node in frontier:
            live = list(getattr(open_node.env, "agents", agents))
            if sorted(live) != sorted(agents):
                raise ValueError(
                    f"item {open_node.node.index}, turn {depth}: live agents {live} differ from the policies' {agents}"
                )
        # Each agent is asked once, about the open nodes where it acts (turn-based envs).
        asked = {agent: [o for o in frontier if agent in o.acting] for agent in agents}
        answers = sample_agents(
            policies,
            {agent: [o.node.observations[agent] for o in asked[agent]] for agent in agents if asked[agent]},
            num_samples,
            {
                agent: [None if o.node.seed is None else derive_seed(o.node.seed, position) for o in asked[agent]]
                for position, agent in enumerate(agents)
                if asked[agent]
            },
        )
        answer_of = {agent: {id(o): answers[agent][p] for p, o in enumerate(asked[agent])} for agent in answers}
        next_frontier: list[_Open] = []
        for open_node in frontier:
            node, root = open_node.node, open_node.root
            if root.error is not None:
                continue
            acting = open_node.acting
            combos = joint_actions(num_samples, len(acting), joint_mode)
            node.completions = {agent: list(answer_of[agent][id(open_node)]) for agent in acting}
            node.joint = combos
            spaces = {agent: _action_space(open_node.env, agent) for agent in acting}
            joint = [
                {agent: _env_action(spaces[agent], node.completions[agent][combo[i]]) for i, agent in enumerate(acting)}
                for combo in combos
            ]
            where = f"item {node.index}, turn {depth}"
            try:
                stepper = _Stepper(open_node.env, joint)
            except TaskError as exc:
                if not skip_errors:
                    raise
                root.error = str(exc)
                continue
            if per_agent_rewards:
                node.rewards, node.agent_rewards = _agent_rewards([rewards for rewards, *_ in stepper.results], agents, where)
            else:
                node.rewards = [shared_reward(rewards, agents, where, learner) for rewards, *_ in stepper.results]
            node.details = [_details(infos, agents) for *_, infos in stepper.results]
            node.children = [None] * len(combos)
            stop = should_stop(node.rewards, early_termination_threshold)
            if stop or depth == num_turns - 1:
                continue
            for j, (_, terminations, truncations, _) in enumerate(stepper.results):
                if any(terminations.get(a, False) or truncations.get(a, False) for a in agents):
                    continue
                try:
                    twin, observations, infos = stepper.child(j)
                except TaskError as exc:
                    if not skip_errors:
                        raise
                    root.error = str(exc)
                    break
                child = RolloutNode(depth + 1, node.index, dict(observations), cross_aggregation=cross_aggregation)
                child.seed = None if node.seed is None else derive_seed(node.seed, "child", j)
                node.children[j] = child
                next_frontier.append(_Open(child, twin, root, acting_of(twin, infos, agents, f"item {node.index}, turn {depth + 1}")))
        frontier = [o for o in next_frontier if o.root.error is None]

    for root in roots:
        if root.error is None:
            _compute_returns(root, discount, tree_return_aggregation, tree_return_temperature)
    return roots


def collect_trees(
    env: ParallelEnv, policies: Mapping[str, Policy], indices: Sequence[int], args: Any, *, seed: int | None = None
) -> list[RolloutNode]:
    """One rollout tree per dataset index, shaped by a learner config (docs/algorithms.md §3).

    Uses ``args.num_generations`` (K), ``num_turns``, ``joint_mode``, ``cross_aggregation``,
    ``early_termination_threshold``, ``discount`` and ``reward_error_policy``; ``seed`` keys the
    per-node random streams (see the module docstring). A config class with
    ``per_agent_rewards = True`` (the actor-critic configs) accepts agents' rewards that differ;
    one with ``discounted_tree_returns = False`` (the same) gets undiscounted node returns.
    ``tree_return_aggregation`` (with ``tree_return_temperature``) says how an inner node's
    return takes its children's: their mean, or optimistically their (soft) maximum.
    """
    return grow_trees(
        env,
        policies,
        indices,
        num_samples=args.num_generations,
        num_turns=args.num_turns,
        joint_mode=args.joint_mode,
        cross_aggregation=args.cross_aggregation,
        early_termination_threshold=args.early_termination_threshold,
        discount=args.discount if getattr(args, "discounted_tree_returns", True) else 1.0,
        skip_errors=getattr(args, "reward_error_policy", "raise") == "skip",
        seed=seed,
        per_agent_rewards=bool(getattr(args, "per_agent_rewards", False)),
        learner=type(args).__name__.removesuffix("Config") + "Trainer",
        tree_return_aggregation=getattr(args, "tree_return_aggregation", "mean"),
        tree_return_temperature=getattr(args, "tree_return_temperature", 1.0),
    )


def _details(infos: Mapping[str, Mapping[str, Any]], agents: Sequence[str]) -> dict[str, Any]:
    info = infos.get(agents[0], {}) if isinstance(infos, Mapping) else {}
    return dict(info.get("reward_details", {})) if isinstance(info, Mapping) else {}


def _compute_returns(node: RolloutNode, discount: float, how: str = "mean", temperature: float = 1.0) -> None:
    returns = []
    for reward, child in zip(node.rewards, node.children):
        if child is not None:
            _compute_returns(child, discount, how, temperature)
        returns.append(discounted_return(reward, child.returns if child is not None else None, discount, how, temperature))
    node.returns = returns
