"""Recorded rollout trees: what the agents said, what it earned, and which answer got which credit.

On the first dataset batch and then every ``rollout_log_steps`` batches (0: off; nothing is
recorded without an ``output_dir``), the trainer appends the trees of that batch to
``output_dir/rollouts/step-{batch:06d}.jsonl``, one tree per line; every evaluation appends its
episodes to ``rollouts/eval-{batch:06d}.jsonl`` the same way (one answer per agent, so no
advantages). ``batch`` is the 0-based dataset batch, the x-axis of the metrics. Recording reads
the trees and training samples and changes nothing: training with and without it gives the same
weights. ``llm-marl view RUN_DIR`` draws the files (llm_marl/viewer). On resume from a checkpoint
taken after batch s, files of batches >= s (written by the interrupted run) are deleted.

Schema (``version`` 1) of one line::

    {"schema": "llm_marl.rollout_tree", "version": 1,
     "kind": "train" | "eval", "step": batch, "item": dataset index,
     "num_nodes": len(nodes), "reward_mean": mean reward of the root's joint actions,
     "agents": [agent, ...],                   # agent order of the joint-action tuples
     "settings": {"num_turns", "joint_mode", "cross_aggregation", "advantage_mode",
                  "advantage_normalization", "early_termination_threshold", "discount",
                  "reference_kl_coef" (null when the reference KL is off)},
     "nodes": [node, ...]}                      # creation order; nodes[0] is the root

    node = {"id": position in "nodes", "parent": id or null, "parent_joint": j of the parent or null,
            "turn": 0-based, "seed": per-node seed or null,
            "status": "expanded" | "early_terminated" | "last_turn" | "ended",
            "observations": {agent: prompt},
            "joint": [[answer index per acting agent], ...],   # joint action j
            "rewards": [r_j], "returns": [G_j], "details": [reward details_j],
            "children": [child id or null per j],        # null: branch not expanded
            "agents": {agent: {                           # the agents that acted at this node
                                                          # (all, unless turn-based), in order
                "completions": [{"text", "tokens" (token count, or null without token ids),
                                 "action" (menu index or null)}, ...],   # the K answers
                "returns": per-answer returns (docs/algorithms.md §3.7),
                "kl": per-answer reference KL or null,
                "penalized_returns": returns - coef * kl (what the baseline saw) or null,
                "advantages_baseline": after the baseline, before normalization: the group
                                       baseline's, or y - V of an actor-critic learner's
                                       critic (null in eval),
                "advantages": as trained on, after normalization (null in eval, and for
                              actor-critic learners with advantage_normalization, which
                              whiten at the update over the whole buffer),
                "critic": actor-critic learners: {"values", "action_values", "targets",
                          "rewards" (KL-shaped)} per answer; null otherwise}}}

``status``: "expanded" — at least one joint action has a child; "early_terminated" — its mean
reward was above ``early_termination_threshold``; "last_turn" — the horizon; "ended" — the env
ended every branch. Numpy numbers and arrays are stored as numbers and lists; NaN, infinities
and other values JSON cannot hold as their ``repr``. Token ids are not stored (their count is):
they would double the files. :func:`read_trees` reads a file back and :func:`tree_from_record`
rebuilds the :class:`~llm_marl.learners.tree.RolloutNode` (its completions without token ids).
Every line starts with the keys up to ``reward_mean``, in this order, so that a viewer can list
a file's trees without parsing each line whole.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from llm_marl.advantages import group_advantages
from llm_marl.rollouts import RolloutNode, iter_nodes
from llm_marl.policies.base import Completion

SCHEMA = "llm_marl.rollout_tree"
VERSION = 1
FILE_PATTERN = re.compile(r"^(step|eval)-(\d+)\.jsonl$")


def rollout_file(kind: str, step: int) -> str:
    """The file name of the trees of ``kind`` ("train" or "eval") recorded at batch ``step``."""
    return f"{'step' if kind == 'train' else 'eval'}-{step:06d}.jsonl"


def node_status(node: RolloutNode, num_turns: int, threshold: float | None) -> str:
    """Why a node has the children it has: "expanded", "early_terminated", "last_turn" or "ended"."""
    if any(child is not None for child in node.children):
        return "expanded"
    if node.turn + 1 >= num_turns:
        return "last_turn"
    if threshold is not None and node.rewards and sum(node.rewards) / len(node.rewards) > threshold:
        return "early_terminated"
    return "ended"


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it (numpy numbers and arrays become numbers and lists)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # JSON has no NaN or infinity (browsers refuse them)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _completion(completion: Completion) -> dict[str, Any]:
    ids = completion.token_ids
    return {"text": completion.text, "tokens": None if ids is None else len(ids), "action": completion.action}


def _baseline_advantages(sample: Any, settings: Mapping[str, Any]) -> list[float] | None:
    """The advantages after the baseline, before normalization: the group baseline's for the
    REINFORCE learners, y - V (or y - Q) of the critic for the actor-critic ones."""
    if sample is None:
        return None
    if settings.get("critic_type") is not None:
        return list(sample.advantages)  # the critic's, before the update whitens them
    if settings.get("advantage_mode") is None:
        return None
    return group_advantages(list(sample.returns), settings["advantage_mode"], normalize=False)


def _trained_advantages(sample: Any, settings: Mapping[str, Any]) -> list[float] | None:
    """The advantages as trained on. Actor-critic learners whiten theirs at the update, over
    every sample the buffer holds then (not only this batch's): with normalization on, they are
    not known when the tree is recorded, and null is recorded rather than a different number."""
    if sample is None:
        return None
    if settings.get("critic_type") is not None and _normalized(sample.agent, settings):
        return None
    return list(sample.advantages)


def _normalized(agent: str, settings: Mapping[str, Any]) -> bool:
    """Whether ``agent``'s advantages are normalized: its entry of agent_advantage_normalization
    (keyed by agent here), else advantage_normalization."""
    per_agent = settings.get("agent_advantage_normalization")
    return bool(per_agent[agent] if per_agent is not None else settings.get("advantage_normalization"))


def _critic_fields(sample: Any) -> dict[str, Any] | None:
    """What an actor-critic sample adds (V of the observation, Q of the answers, TD targets,
    shaped rewards); None for other samples."""
    if sample is None or not hasattr(sample, "values"):
        return None
    return {name: list(getattr(sample, name, []) or []) for name in ("values", "action_values", "targets", "rewards")}


def tree_record(
    root: RolloutNode,
    agents: Sequence[str],
    *,
    kind: str,
    step: int,
    settings: Mapping[str, Any],
    samples: Mapping[int, Sequence[Any]] | None = None,
) -> dict[str, Any]:
    """One tree as a JSON-ready dict (the schema above).

    ``samples`` maps ``id(node)`` to that node's training samples, agents in order (see
    :func:`samples_by_node`); None for evaluation episodes.
    """
    nodes = list(root.nodes())
    ids = {id(node): n for n, node in enumerate(nodes)}
    parents: dict[int, tuple[int, int]] = {}
    for n, node in enumerate(nodes):
        for j, child in enumerate(node.children):
            if child is not None:
                parents[id(child)] = (n, j)
    records = []
    for n, node in enumerate(nodes):
        parent = parents.get(id(node))
        per_agent = {}
        own = {} if samples is None else {s.agent: s for s in samples[id(node)]}
        if samples is not None and len(own) != len(samples[id(node)]):
            raise ValueError(f"item {node.index}, turn {node.turn}: two samples of one agent at node {n}")
        for agent in agents:
            if not node.acts(agent):
                continue  # turn-based: this agent did not act here
            sample = own.get(agent) if samples is not None else None
            if samples is not None and sample is None:
                raise ValueError(f"item {node.index}, turn {node.turn}: no sample of acting agent {agent!r} at node {n}")
            if sample is not None and (sample.agent, sample.index, sample.turn) != (agent, node.index, node.turn):
                raise ValueError(
                    f"item {node.index}, turn {node.turn}: sample of agent {sample.agent!r} (item {sample.index}, "
                    f"turn {sample.turn}) does not belong to node {n}, agent {agent!r}"
                )
            kl = list(sample.kl) if sample is not None and sample.kl else None
            per_agent[agent] = {
                "completions": [_completion(c) for c in node.completions[agent]],
                "returns": node.agent_returns(agent),
                "kl": kl,
                "penalized_returns": list(sample.returns) if kl is not None and settings.get("advantage_mode") else None,
                "advantages_baseline": _baseline_advantages(sample, settings),
                "advantages": _trained_advantages(sample, settings),
                "critic": _critic_fields(sample),
            }
        records.append(
            {
                "id": n,
                "parent": None if parent is None else parent[0],
                "parent_joint": None if parent is None else parent[1],
                "turn": node.turn,
                "seed": node.seed,
                "status": node_status(node, settings["num_turns"], settings["early_termination_threshold"]),
                "observations": {agent: _plain(node.observations[agent]) for agent in agents},
                "joint": [list(combo) for combo in node.joint],
                "rewards": list(node.rewards),
                "returns": list(node.returns),
                "details": [_plain(d) for d in node.details],
                "children": [None if child is None else ids[id(child)] for child in node.children],
                "agents": per_agent,
            }
        )
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "kind": kind,
        "step": step,
        "item": root.index,
        "num_nodes": len(records),
        "reward_mean": sum(root.rewards) / len(root.rewards) if root.rewards else None,
        "agents": list(agents),
        "settings": dict(settings),
        "cross_aggregation": root.cross_aggregation,
        "nodes": records,
    }


def samples_by_node(roots: Sequence[RolloutNode], samples: Sequence[Any], num_agents: int) -> dict[int, list[Any]]:
    """``id(node)`` -> that node's samples, for samples in the order ``samples_from_trees`` makes
    them (every node of the trees in creation order, one sample per agent acting there; learners
    that keep every agent's sample at every node — ``num_agents`` each — are accepted too)."""
    nodes = list(iter_nodes(roots))
    if len(samples) == len(nodes) * num_agents:
        return {id(node): list(samples[n * num_agents : (n + 1) * num_agents]) for n, node in enumerate(nodes)}
    sizes = [len(node.completions) for node in nodes]
    if len(samples) != sum(sizes):
        raise ValueError(f"{len(samples)} samples for {len(nodes)} nodes with {sum(sizes)} acting agents ({num_agents} agents)")
    grouped, offset = {}, 0
    for node, size in zip(nodes, sizes):
        grouped[id(node)] = list(samples[offset : offset + size])
        offset += size
    return grouped


def tree_from_record(record: Mapping[str, Any]) -> RolloutNode:
    """Rebuild the root :class:`RolloutNode` of a recorded tree (observations as recorded)."""
    check_record(record)
    agents = record["agents"]
    built: list[RolloutNode] = []
    for node in record["nodes"]:
        built.append(
            RolloutNode(
                turn=node["turn"],
                index=record["item"],
                observations=dict(node["observations"]),
                completions={
                    agent: [
                        Completion(c["text"], None, c["action"])
                        for c in node["agents"][agent]["completions"]
                    ]
                    for agent in agents
                    if agent in node["agents"]
                },
                joint=[tuple(combo) for combo in node["joint"]],
                rewards=list(node["rewards"]),
                returns=list(node["returns"]),
                details=[dict(d) for d in node["details"]],
                cross_aggregation=record["cross_aggregation"],
                seed=node["seed"],
            )
        )
    for node, rebuilt in zip(record["nodes"], built):
        rebuilt.children = [None if c is None else built[c] for c in node["children"]]
    return built[0]


def check_record(record: Mapping[str, Any], where: str = "record") -> None:
    """Raise ValueError naming what is wrong if ``record`` is not a tree of this schema version."""
    if not isinstance(record, Mapping) or record.get("schema") != SCHEMA:
        raise ValueError(f"{where}: not a recorded rollout tree (schema {SCHEMA!r} expected)")
    if record.get("version") != VERSION:
        raise ValueError(f"{where}: schema version {record.get('version')!r}; this llm_marl reads version {VERSION}")
    for key in ("kind", "step", "item", "agents", "nodes"):
        if key not in record:
            raise ValueError(f"{where}: missing field {key!r}")
    if not record["nodes"]:
        raise ValueError(f"{where}: item {record['item']} has no nodes")


def read_trees(path: str) -> list[dict[str, Any]]:
    """The records of a rollout file, in the order they were written (each checked)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}, line {number}: not JSON ({exc})") from None
            check_record(record, f"{path}, line {number}")
            records.append(record)
    return records


def rollout_files(run_dir: str) -> list[tuple[str, int, str]]:
    """``(kind, step, path)`` of every rollout file of a run, sorted by step; at one step the
    evaluation (run before that batch) comes first."""
    folder = os.path.join(run_dir, "rollouts")
    found = []
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            match = FILE_PATTERN.match(name)
            if match:
                kind = "train" if match.group(1) == "step" else "eval"
                found.append((kind, int(match.group(2)), os.path.join(folder, name)))
    return sorted(found, key=lambda entry: (entry[1], entry[0] == "train"))


def markdown_tree(record: Mapping[str, Any], max_nodes: int = 6, max_chars: int = 160) -> str:
    """A readable markdown summary of a recorded tree (for TensorBoard's text tab): per node the
    agents' prompts, then one row per joint action with the answers, reward and return, then one
    row per answer with its return and advantage."""
    agents = record["agents"]

    def cell(value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value)
        text = text if len(text) <= max_chars else text[: max_chars - 1] + "…"
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ⏎ ") or " "

    def number(value: Any) -> str:
        return "–" if value is None else f"{value:.3f}"

    lines = [f"**{record['kind']} batch {record['step']}, item {record['item']}** ({len(record['nodes'])} nodes)", ""]
    for node in record["nodes"][:max_nodes]:
        lines.append(f"*node {node['id']}, turn {node['turn'] + 1}, {node['status']}*")
        lines.append("")
        lines.append("| agent | prompt |")
        lines.append("|---|---|")
        for agent in agents:
            lines.append(f"| {cell(agent)} | {cell(node['observations'][agent])} |")
        lines.append("")
        acting = [a for a in agents if a in node["agents"]]
        lines.append("| joint | " + " | ".join(cell(a) for a in acting) + " | reward | return |")
        lines.append("|---|" + "---|" * len(acting) + "---|---|")
        for j, combo in enumerate(node["joint"]):
            answers = [node["agents"][a]["completions"][k]["text"] for a, k in zip(acting, combo)]
            lines.append(
                f"| {j} | " + " | ".join(cell(t) for t in answers) + f" | {number(node['rewards'][j])} | {number(node['returns'][j])} |"
            )
        lines.append("")
        lines.append("| agent | answer | return | advantage |")
        lines.append("|---|---|---|---|")
        for agent in acting:
            data = node["agents"][agent]
            for k, completion in enumerate(data["completions"]):
                advantage = data["advantages"][k] if data["advantages"] is not None else None
                lines.append(f"| {cell(agent)} | {cell(completion['text'])} | {number(data['returns'][k])} | {number(advantage)} |")
        lines.append("")
    if len(record["nodes"]) > max_nodes:
        lines.append(f"… {len(record['nodes']) - max_nodes} more nodes: `llm-marl view` shows the whole tree")
    return "\n".join(lines)


class RolloutRecorder:
    """Appends recorded trees to ``output_dir/rollouts`` (see the module docstring).

    ``every``: record train batches 0, every, 2*every, ...; 0 (or no ``output_dir``, or
    ``enabled=False`` on ranks other than the main one) records nothing.
    """

    def __init__(self, output_dir: str | None, every: int, settings: Mapping[str, Any], agents: Sequence[str], enabled: bool = True):
        self.folder = os.path.join(output_dir, "rollouts") if output_dir is not None and every and enabled else None
        self.every = every
        self.settings = dict(settings)
        self.agents = list(agents)

    @classmethod
    def from_args(cls, args: Any, agents: Sequence[str], enabled: bool = True) -> "RolloutRecorder":
        """A recorder for a learner config (``output_dir``, ``rollout_log_steps`` and the tree settings)."""
        names = ("num_turns", "joint_mode", "cross_aggregation", "advantage_mode", "advantage_normalization",
                 "early_termination_threshold", "discount")
        settings = {name: getattr(args, name, None) for name in names}  # a learner family may lack some
        settings["reference_kl_coef"] = args.reference_kl_coef if getattr(args, "reference_kl_enabled", False) else None
        per_agent = getattr(args, "agent_advantage_normalization", None)
        settings["agent_advantage_normalization"] = None if per_agent is None else dict(zip(agents, per_agent))
        if getattr(args, "critic_type", None) is not None:  # actor-critic: advantages come from the critic
            settings["advantage_mode"] = None
            settings["critic_type"] = args.critic_type
        return cls(args.output_dir, getattr(args, "rollout_log_steps", 0), settings, agents, enabled)

    @property
    def active(self) -> bool:
        return self.folder is not None

    def wants(self, step: int) -> bool:
        """Whether train batch ``step`` is recorded."""
        return self.active and step % self.every == 0

    def train_batch(self, step: int, roots: Sequence[RolloutNode], samples: Sequence[Any], logger: Any = None) -> list[dict[str, Any]]:
        """Record the trees of train batch ``step`` (if it is due) and put one of them in
        TensorBoard as text; returns the records written."""
        if not self.wants(step):
            return []
        by_node = samples_by_node(roots, samples, len(self.agents))
        records = [
            tree_record(root, self.agents, kind="train", step=step, settings=self.settings, samples=by_node)
            for root in roots
            if root.error is None
        ]
        self._write("train", step, records, logger)
        return records

    def evaluation(self, step: int, roots: Sequence[RolloutNode], logger: Any = None) -> list[dict[str, Any]]:
        """Record the episodes of an evaluation run before batch ``step``; returns the records."""
        if not self.active:
            return []
        records = [
            tree_record(root, self.agents, kind="eval", step=step, settings=self.settings)
            for root in roots
            if root.error is None
        ]
        self._write("eval", step, records, logger)
        return records

    def purge(self, step: int) -> None:
        """Delete the files of batches >= ``step`` (a resumed run rewrites them)."""
        if not self.active or not os.path.isdir(self.folder):
            return
        for kind, recorded, path in rollout_files(os.path.dirname(self.folder)):
            if recorded >= step:
                os.remove(path)

    def _write(self, kind: str, step: int, records: list[dict[str, Any]], logger: Any) -> None:
        if not records:
            return
        os.makedirs(self.folder, exist_ok=True)
        with open(os.path.join(self.folder, rollout_file(kind, step)), "a", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        log_text = getattr(logger, "log_text", None)
        if log_text is not None:
            chosen = records[random.Random(step).randrange(len(records))]  # a private RNG: training's is untouched
            log_text(f"rollouts/{kind}", markdown_tree(chosen), step)


def iter_records(run_dir: str) -> Iterator[dict[str, Any]]:
    """Every recorded tree of a run, in file order."""
    for _, _, path in rollout_files(run_dir):
        yield from read_trees(path)
