"""Recorded rollout trees (llm_marl/runs/recording.py): what is written equals what was trained on.

Each schema test spies on the trainer's recorder to keep the in-memory trees and samples of the
recorded batches, then reads the files back: the rebuilt RolloutNode equals the in-memory one
(every dataclass field, children included), and every answer's returns, KL, advantages after the
baseline and after normalization equal the samples the optimizer saw.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from llm_marl import DialogueEnv, MAGRPOConfig, MAGRPOTrainer, TabularPolicy
from llm_marl.runs.recording import (
    RolloutRecorder,
    markdown_tree,
    node_status,
    read_trees,
    rollout_files,
    samples_by_node,
    tree_from_record,
)
from llm_marl.learners.tree import iter_nodes
from toy_tasks import MENU, ColourMatch


def tabular_trainer(out, **config):
    settings = dict(
        num_turns=2, num_generations=2, num_train_epochs=1, agent_learning_rate=0.3, eval_interval=0,
        eval_num_samples=2, logging_steps=1, progress_bar=False, early_termination_threshold=None,
        output_dir=str(out), rollout_log_steps=1, seed=3,
    )
    settings.update(config)
    env = DialogueEnv(ColourMatch(num_items=settings.pop("items", 4), num_turns=settings["num_turns"]))
    return MAGRPOTrainer(env=env, policies=[TabularPolicy(list(MENU)), TabularPolicy(list(MENU))], args=MAGRPOConfig(**settings))


def spy(trainer):
    """Keep (step, roots, samples) of every recorded train batch and (step, roots) of every evaluation."""
    seen = {"train": [], "eval": []}
    train_batch, evaluation = trainer.recorder.train_batch, trainer.recorder.evaluation

    def record_train(step, roots, samples, logger=None):
        if trainer.recorder.wants(step):
            seen["train"].append((step, list(roots), list(samples)))
        return train_batch(step, roots, samples, logger)

    def record_eval(step, roots, logger=None):
        seen["eval"].append((step, list(roots)))
        return evaluation(step, roots, logger)

    trainer.recorder.train_batch, trainer.recorder.evaluation = record_train, record_eval
    return seen


def without_token_ids(root):
    """A copy of the tree whose completions carry no token ids (the record keeps their count)."""
    copy = dataclasses.replace(root, completions={a: [dataclasses.replace(c, token_ids=None) for c in cs] for a, cs in root.completions.items()})
    copy.children = [None if child is None else without_token_ids(child) for child in root.children]
    return copy


def assert_matches(record, root, samples, agents, args):
    """Every recorded field against the in-memory tree and its training samples (None: eval)."""
    assert record["schema"] == "llm_marl.rollout_tree" and record["version"] == 1
    assert record["item"] == root.index and record["agents"] == agents and record["num_nodes"] == len(record["nodes"])
    assert record["reward_mean"] == sum(root.rewards) / len(root.rewards)
    assert list(record)[:7] == ["schema", "version", "kind", "step", "item", "num_nodes", "reward_mean"]
    assert tree_from_record(record) == without_token_ids(root)  # every RolloutNode field, children included
    nodes = list(root.nodes())
    assert [n["id"] for n in record["nodes"]] == list(range(len(nodes)))
    by_node = {}
    if samples is not None:
        in_order = list(iter_nodes([root]))
        by_node = {id(node): samples[id(node)] for node in in_order}
    for node, saved in zip(nodes, record["nodes"]):
        assert saved["turn"] == node.turn
        assert saved["status"] == node_status(node, args.num_turns, args.early_termination_threshold)
        for child, kept in zip(node.children, saved["children"]):
            if child is not None:
                assert record["nodes"][kept]["parent"] == saved["id"]
        for a, agent in enumerate(agents):
            data = saved["agents"][agent]
            assert data["returns"] == node.agent_returns(agent)
            for c, completion in zip(data["completions"], node.completions[agent]):
                assert c["tokens"] == (None if completion.token_ids is None else len(completion.token_ids))
            if samples is None:
                assert data["advantages"] is None and data["advantages_baseline"] is None and data["kl"] is None
                continue
            sample = by_node[id(node)][a]
            assert sample.agent == agent
            assert data["advantages"] == sample.advantages
            assert data["kl"] == (sample.kl or None)
            if sample.kl:
                assert data["penalized_returns"] == sample.returns
                assert data["penalized_returns"] == pytest.approx(
                    [g - args.reference_kl_coef * d for g, d in zip(data["returns"], data["kl"])], abs=1e-12)
            # mean baseline by hand, then normalization by the population std gives what was trained on
            penalized = data["penalized_returns"] or data["returns"]
            mean = sum(penalized) / len(penalized)
            assert data["advantages_baseline"] == pytest.approx([g - mean for g in penalized], abs=1e-12)
            centred = data["advantages_baseline"]
            std = (sum(x * x for x in centred) / len(centred)) ** 0.5
            assert data["advantages"] == pytest.approx([x / max(std, 1e-6) for x in centred], abs=1e-9)


def check_run(trainer, seen, kind="train"):
    out = trainer.args.output_dir
    files = {(k, s): p for k, s, p in rollout_files(out)}
    checked = 0
    for entry in seen[kind]:
        step, roots = entry[0], entry[1]
        records = read_trees(files[(kind, step)])
        assert [r["step"] for r in records] == [step] * len(roots) and {r["kind"] for r in records} == {kind}
        by_node = None
        if kind == "train":
            by_node = samples_by_node(roots, entry[2], len(trainer.agents))
        for record, root in zip(records, roots, strict=True):
            assert_matches(record, root, by_node, trainer.agents, trainer.args)
            checked += 1
    return checked


@pytest.mark.parametrize(
    "joint_mode, k, threshold, statuses",
    [
        ("aligned", 3, None, {"expanded", "last_turn"}),
        ("cross", 2, 1.4, {"expanded", "last_turn", "early_terminated"}),
    ],
)
def test_recorded_tabular_trees_equal_the_trained_ones(tmp_path, joint_mode, k, threshold, statuses):
    trainer = tabular_trainer(tmp_path / "run", joint_mode=joint_mode, num_generations=k, early_termination_threshold=threshold, items=6)
    seen = spy(trainer)
    trainer.train()
    assert [step for step, *_ in seen["train"]] == list(range(6))
    assert check_run(trainer, seen) == 6
    recorded = [n["status"] for _, _, p in rollout_files(tmp_path / "run") for r in read_trees(p) for n in r["nodes"]]
    assert set(recorded) == statuses  # multi-turn trees, and with a threshold early-terminated nodes too
    if joint_mode == "cross":
        assert all(len(n["joint"]) == 4 for r in read_trees(rollout_files(tmp_path / "run")[0][2]) for n in r["nodes"])


def test_evaluation_episodes_are_recorded(tmp_path):
    trainer = tabular_trainer(tmp_path / "run", eval_interval=2, items=4, eval_num_samples=3)
    seen = spy(trainer)
    trainer.train()
    trainer.evaluate()
    assert [step for step, _ in seen["eval"]] == [0, 2, 4]
    assert check_run(trainer, seen, kind="eval") == 9
    record = read_trees(os.path.join(tmp_path, "run", "rollouts", "eval-000004.jsonl"))[0]
    assert all(len(d["completions"]) == 1 for n in record["nodes"] for d in n["agents"].values())


class Lengths(ColourMatch):
    """ColourMatch prompts, a reward that varies between language-model answers: their length."""

    def reward(self, item, actions, history):
        return float(len(actions["left"]) + len(actions["right"])) / 10


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from llm_marl.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", pretrain_steps=10, batch_size=4)


def test_recorded_lm_trees_with_reference_kl(tmp_path, tiny_dir):
    from llm_marl.policies.causal_lm import CausalLMPolicy

    policies = [CausalLMPolicy.from_pretrained(tiny_dir, max_new_tokens=6, temperature=1.0, top_p=None, top_k=None) for _ in range(2)]
    args = MAGRPOConfig(
        num_turns=2, num_generations=3, num_train_epochs=1, agent_learning_rate=1e-4, eval_interval=0,
        logging_steps=1, progress_bar=False, early_termination_threshold=None, output_dir=str(tmp_path / "run"),
        rollout_log_steps=2, reference_kl_enabled=True, reference_kl_coef=0.5, max_new_tokens=6, seed=1,
    )
    trainer = MAGRPOTrainer(env=DialogueEnv(Lengths(num_items=3, num_turns=2)), policies=policies, args=args)
    seen = spy(trainer)
    trainer.train()
    assert [step for step, *_ in seen["train"]] == [0, 2]  # batches 0 and 2 of 3
    assert check_run(trainer, seen) == 2
    record = read_trees(os.path.join(tmp_path, "run", "rollouts", "step-000000.jsonl"))[0]
    answer = record["nodes"][0]["agents"]["left"]
    assert all(c["tokens"] >= 1 and "token_ids" not in c for c in answer["completions"])
    assert answer["kl"] is not None and len(answer["kl"]) == 3
    kl = lambda r: [v for n in r["nodes"] for d in n["agents"].values() for v in d["kl"]]  # noqa: E731
    assert set(kl(record)) == {0.0}  # batch 0: the policy is its reference
    later = read_trees(os.path.join(tmp_path, "run", "rollouts", "step-000002.jsonl"))[0]
    assert max(kl(later)) > 0  # after updates it has moved away


def test_recording_does_not_change_training(tmp_path):
    """Same seeds with and without recording (evaluations included): identical weights. A recorder
    that drew from a global RNG or edited the samples in place would make them differ."""
    states = []
    for every in (0, 1):
        trainer = tabular_trainer(tmp_path / f"run{every}", rollout_log_steps=every, joint_mode="cross",
                                  early_termination_threshold=1.4, eval_interval=2, items=6, num_train_epochs=2)
        trainer.train()
        states.append({a: trainer.policies[a].state_dict() for a in trainer.agents})
        assert os.path.isdir(tmp_path / f"run{every}" / "rollouts") == bool(every)
    for agent, state in states[0].items():
        assert state.keys() == states[1][agent].keys()
        for name, value in state.items():
            other = states[1][agent][name]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, (agent, name)
    assert any(isinstance(v, torch.Tensor) and v.abs().sum() > 0 for v in states[0]["left"].values())  # it did train


def test_lm_recording_does_not_change_training(tmp_path, tiny_dir):
    from llm_marl.policies.causal_lm import CausalLMPolicy

    weights = []
    for every in (0, 1):
        policies = [CausalLMPolicy.from_pretrained(tiny_dir, max_new_tokens=5, temperature=1.0, top_p=None, top_k=None) for _ in range(2)]
        args = MAGRPOConfig(num_turns=1, num_generations=2, num_train_epochs=1, agent_learning_rate=1e-3, eval_interval=1,
                            eval_num_samples=1, logging_steps=1, progress_bar=False, early_termination_threshold=None,
                            output_dir=str(tmp_path / f"run{every}"), rollout_log_steps=every, reference_kl_enabled=True, seed=5)
        trainer = MAGRPOTrainer(env=DialogueEnv(Lengths(num_items=2, num_turns=1)), policies=policies, args=args)
        trainer.train()
        weights.append([p.detach().clone() for a in trainer.agents for p in trainer.policies[a].parameters()])
    assert all(torch.equal(a, b) for a, b in zip(weights[0], weights[1], strict=True))


def test_first_batch_then_every_n_and_off(tmp_path):
    trainer = tabular_trainer(tmp_path / "every3", num_turns=1, items=7, rollout_log_steps=3)
    trainer.train()
    assert [(k, s) for k, s, _ in rollout_files(tmp_path / "every3")] == [("train", 0), ("train", 3), ("train", 6)]
    off = tabular_trainer(tmp_path / "off", num_turns=1, items=3, rollout_log_steps=0, eval_interval=1)
    off.train()
    assert not os.path.exists(tmp_path / "off" / "rollouts")
    with pytest.raises(ValueError, match="rollout_log_steps must be an int >= 0"):
        MAGRPOConfig(rollout_log_steps=-1)


def test_resume_deletes_the_interrupted_runs_later_files(tmp_path):
    recorder = RolloutRecorder(str(tmp_path), 1, {}, ["a"])
    os.makedirs(tmp_path / "rollouts")
    for name in ("step-000000.jsonl", "eval-000003.jsonl", "step-000003.jsonl", "step-000004.jsonl", "notes.txt"):
        (tmp_path / "rollouts" / name).write_text("")
    recorder.purge(3)
    assert sorted(os.listdir(tmp_path / "rollouts")) == ["notes.txt", "step-000000.jsonl"]


def test_bad_files_are_named(tmp_path):
    path = tmp_path / "step-000000.jsonl"
    path.write_text('{"schema": "llm_marl.rollout_tree", "version": 1, "kind": "train", "step": 0, "item": 0, "agents": [], "nodes": [{}]}\n{oops\n')
    with pytest.raises(ValueError, match=r"step-000000.jsonl, line 2: not JSON"):
        read_trees(str(path))
    path.write_text(json.dumps({"schema": "llm_marl.rollout_tree", "version": 99}) + "\n")
    with pytest.raises(ValueError, match="line 1: schema version 99"):
        read_trees(str(path))


def test_tensorboard_gets_one_tree_per_recorded_step_as_markdown(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = tabular_trainer(tmp_path / "run", num_turns=1, items=4, rollout_log_steps=2)
    trainer.train()
    events = EventAccumulator(str(tmp_path / "run" / "logs"), size_guidance={"tensors": 0})
    events.Reload()
    texts = events.Tensors("rollouts/train/text_summary")
    assert [t.step for t in texts] == [0, 2]
    text = texts[0].tensor_proto.string_val[0].decode()
    record = read_trees(str(tmp_path / "run" / "rollouts" / "step-000000.jsonl"))[0]
    assert text == markdown_tree(record)
    assert "item 0: left, name a colour" in text and "| joint | left | right | reward | return |" in text
    answers = [c["text"] for c in record["nodes"][0]["agents"]["left"]["completions"]]
    assert all(f"| left | {a} |" in text for a in answers)


def test_markdown_escapes_table_breakers():
    record = {
        "kind": "train", "step": 1, "item": 2, "agents": ["a"],
        "nodes": [{"id": 0, "turn": 0, "status": "last_turn", "observations": {"a": "x | y\nz"}, "joint": [[0], [1]],
                   "rewards": [1.0, 0.0], "returns": [1.0, 0.0],
                   "agents": {"a": {"completions": [{"text": "p|q"}, {"text": ""}], "returns": [1.0, 0.0], "advantages": [1.0, -1.0]}}}],
    }
    text = markdown_tree(record)
    assert "| a | x \\| y ⏎ z |" in text and "| 0 | p\\|q | 1.000 | 1.000 |" in text and "| a | p\\|q | 1.000 | 1.000 |" in text
    assert all(line.count(" | ") >= 1 for line in text.splitlines() if line.startswith("| ") and "---" not in line)


@pytest.mark.parametrize("normalize", [False, True])
def test_actor_critic_trees_record_the_critics_view(tmp_path, normalize):
    """IAC shares the loop: its recorded answers carry the critic's advantages y - V as the
    baseline's, V and the TD targets. Without normalization those are the advantages trained on;
    with it the update whitens them over its whole buffer, so none is claimed as trained on."""
    from llm_marl.learners import IACConfig, IACTrainer

    args = IACConfig(num_turns=2, num_generations=2, num_train_epochs=1, agent_learning_rate=0.1, critic_learning_rate=0.1,
                     eval_interval=0, logging_steps=1, progress_bar=False, early_termination_threshold=None,
                     output_dir=str(tmp_path / "run"), rollout_log_steps=1, seed=3, advantage_normalization=normalize)
    trainer = IACTrainer(env=DialogueEnv(ColourMatch(num_items=2, num_turns=2)),
                         policies=[TabularPolicy(list(MENU)), TabularPolicy(list(MENU))], args=args)
    seen = spy(trainer)
    trainer.train()
    step, roots, samples = seen["train"][0]
    record = read_trees(str(tmp_path / "run" / "rollouts" / "step-000000.jsonl"))[0]
    assert tree_from_record(record) == without_token_ids(roots[0])
    by_node = samples_by_node(roots, samples, 2)
    for node, saved in zip(roots[0].nodes(), record["nodes"]):
        for a, agent in enumerate(trainer.agents):
            data, sample = saved["agents"][agent], by_node[id(node)][a]
            raw = [y - v for y, v in zip(sample.targets, sample.values)] if args.critic_type == "v" else None
            assert data["advantages_baseline"] == sample.advantages == pytest.approx(raw)
            assert data["advantages"] == (None if normalize else sample.advantages)
            assert data["critic"]["values"] == sample.values and data["critic"]["targets"] == sample.targets
    assert record["settings"]["advantage_mode"] is None and record["settings"]["critic_type"] == args.critic_type
