"""Sharded agents (``fsdp=True``): FSDP2 across gloo ranks under torchrun, on a tiny GPT-2.

One torchrun launch (2 ranks) trains two LM agents with MAGRPO, sharded per decoder layer; the
same run in one process, unsharded, is the reference:

* after 2 optimizer steps each agent's weights equal the unsharded run's (fp32 tolerance), with
  gradient checkpointing on one agent, data-dependent scoring chunks (``max_batch_tokens``) on
  the other, and gradient clipping;
* the sampler is the trained policy: at the start of every rollout the gathered weights give a
  fixed answer the same log-prob as the unsharded run's current weights do (so each sampling call
  after a sharded optimizer step sees the new weights);
* the reference models (reference KL on) are sharded too: they stay frozen, and the KL penalties
  they give shape the same gradients as in the unsharded run;
* per rank, the bytes of parameters, gradients, AdamW state and reference weights (measured from
  the local shards' storages) are about half of the unsharded run's;
* MADPO (the joint DPO loss over both sharded agents, margins against sharded references) trains
  like one unsharded process too;
* a 2-D mesh (4 ranks, ``fsdp_shard_size=2``: shard in pairs, replicate across them) trains like
  one unsharded process on all 4 ranks' items, with half the bytes per rank;
* stopping after one step and resuming from the sharded checkpoint (``torch.distributed.checkpoint``)
  gives the uninterrupted run's weights;
* ``save_model`` writes one consolidated Hugging Face folder per agent, which reloads to the
  trained weights;
* ``mixed_precision=True`` trains with bf16 gathered weights and fp32 shards, gradients and AdamW
  state;
* IAC with separate critics (each a copy of its agent's model, sharded, its value head whole):
  actors' and critics' gradients and weights equal the unsharded run's, half the bytes per rank,
  and ``save_model`` writes each critic consolidated;
* a LoRA team (its frozen base sharded, its adapters whole on every rank): the adapters'
  gradients and weights equal the unsharded run's, the sampler is the trained policy, the base's
  bytes per rank are half, the base stays frozen, stop/resume is exact and ``save_model`` writes
  peft adapters that reload.

A second launch (``test_sharded_critics_...``): IAC stopped after one step and resumed from its
checkpoint (critics' shards, heads and optimizer states) equals the uninterrupted run; MAAC's
central critic and IAC on a LoRA team (value adapters on the sharded base) train like one
unsharded process.

The one-line errors (``fsdp`` with "mp", with tabular policies, without a process group) need
no launch.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

from llm_marl.envs import DialogueEnv
from llm_marl.learners import IACConfig, IACTrainer, MAACConfig, MAACTrainer, MADPOConfig, MADPOTrainer, MAGRPOConfig, MAGRPOTrainer
from llm_marl.learners.preference.reward_model import MARLHFConfig, MARLHFTrainer
from llm_marl.policies.base import Completion
from llm_marl.policies.causal_lm import CausalLMPolicy
from llm_marl.policies.lora_team import AdapterPolicy, LoRATeam
from llm_marl.policies.tabular import TabularPolicy
from llm_marl.policies.tiny import build_tiny_model, default_model_dir
from llm_marl.runs.fsdp import local_nbytes
from llm_marl.tasks.function_task import FunctionTask
from toy_tasks import MENU, ColourMatch

torch.set_num_threads(1)

TESTS = os.path.dirname(os.path.abspath(__file__))
PROMPTS = ["The assert statement", "If the module being imported is not a top level module,", "A", "The return value"]
PROBE = ("The assert statement", " is used")

RANK_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from test_fsdp import run
result = run({model_dir!r}, fsdp=True, items_per_step=1, rollout_buffer_size=1, save_to={save_to!r})
# stopped after one step (a sharded checkpoint), then resumed by a new trainer
run({model_dir!r}, fsdp=True, items_per_step=1, rollout_buffer_size=1, output_dir={run_dir!r}, max_steps=1)
result["checkpoint"] = sorted(os.listdir(os.path.join({run_dir!r}, "checkpoint-1", "agent_0", "shards")))
result["resumed"] = run({model_dir!r}, fsdp=True, items_per_step=1, rollout_buffer_size=1, output_dir={run_dir!r}, resume=True)
result["madpo"] = run({model_dir!r}, learner="madpo", fsdp=True, items_per_step=1, rollout_buffer_size=1)
# fsdp_gather="layer": one layer gathered per forward; 3 items, so rank 1 has none in batch 2
result["layer"] = run({model_dir!r}, fsdp=True, gather="layer", items=3, items_per_step=1, rollout_buffer_size=1)
result["layer_model"] = run({model_dir!r}, fsdp=True, items=3, items_per_step=1, rollout_buffer_size=1)
result["bf16"] = run({model_dir!r}, fsdp=True, mixed_precision=True, items_per_step=1, rollout_buffer_size=1)
result["iac"] = run({model_dir!r}, learner="iac", fsdp=True, items_per_step=1, rollout_buffer_size=1, save_to={iac_saved!r})
# a LoRA team: its base sharded, its adapters whole on every rank; stopped after one step and resumed
team = dict(team=True, fsdp=True, items_per_step=1, rollout_buffer_size=1)
result["team"] = run({model_dir!r}, save_to={team_saved!r}, **team)
result["team_layer"] = run({model_dir!r}, gather="layer", **team)
run({model_dir!r}, output_dir={team_dir!r}, max_steps=1, **team)
result["team_resumed"] = run({model_dir!r}, output_dir={team_dir!r}, resume=True, **team)
rank = int(os.environ["RANK"])
torch.save(result, os.path.join({out!r}, f"rank{{rank}}.pt"))
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)  # results are written: skip interpreter teardown, where gloo's threads can abort a rank
"""


class Seeded:
    """A policy whose answers depend only on each tree node's seed (tree.py passes generators),
    not on which rank or batch samples them: so one process and two ranks draw the same answers."""

    def sample(self, observations, num_samples, generators=None):
        if generators is None:
            return super().sample(observations, num_samples)
        answers = []
        for observation, generator in zip(observations, generators):
            torch.manual_seed(generator.initial_seed())
            answers += super().sample([observation], num_samples)
        return answers


class SeededLM(Seeded, CausalLMPolicy):
    """A full-model agent with seeded answers."""


class SeededAdapter(Seeded, AdapterPolicy):
    """An agent of a LoRA team with seeded answers (each samples alone, on the team's base)."""


def length_reward(a, b):
    return [float(len(a[0]) + len(b[0]))]


def lora_team(model_dir, **settings):
    """Two agents as LoRA adapters on one tiny GPT-2 base (gradient checkpointing on, scoring in
    data-dependent chunks); each samples alone with seeded answers."""
    team = LoRATeam.from_pretrained(model_dir, agents=("a0", "a1"), r=4, alpha=8, gradient_checkpointing=True, max_batch_tokens=24, **settings)
    for policy in team.policies.values():
        policy.__class__ = SeededAdapter
    return team


def run(model_dir, *, learner="magrpo", team=False, reference=True, fsdp=False, mixed_precision=False, gather="model", shard_size=None, items=4, items_per_step=2, rollout_buffer_size=2, save_to=None, output_dir=None, max_steps=None, resume=None):
    """Train 2 LM agents for 2 batches; returns weights, probe log-probs and measured bytes."""
    task = FunctionTask(length_reward, lambda item: item["prompt"], dataset=[{"prompt": PROMPTS[i % len(PROMPTS)]} for i in range(items)], num_agents=2, num_turns=1)
    settings = dict(max_new_tokens=6, temperature=1.0, top_p=None, top_k=None)
    if team:
        policies = list(lora_team(model_dir, **settings).policies.values())
    else:
        policies = [SeededLM.from_pretrained(model_dir, **settings),
                    SeededLM.from_pretrained(model_dir, max_batch_tokens=24, **settings)]
        model = policies[0].model
        if hasattr(model, "activation_checkpointing_enable"):  # transformers' new name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policies[0].model.train()
    common = dict(
        num_agents=2, num_turns=1, num_train_epochs=1, max_new_tokens=6, temperature=1.0, top_p=1.0,
        top_k=None, items_per_step=items_per_step, rollout_buffer_size=rollout_buffer_size, eval_interval=0,
        logging_steps=1, progress_bar=False, early_termination_threshold=None, agent_learning_rate=1e-2,
        max_grad_norm=1.0, seed=5, fsdp=fsdp, mixed_precision=mixed_precision, fsdp_gather=gather, fsdp_shard_size=shard_size, save_final_checkpoint=output_dir is not None, output_dir=output_dir,
        max_steps=max_steps,
    )
    if learner == "madpo":  # the joint DPO loss over both agents, against sharded references
        args = MADPOConfig(preference_num_candidates=3, preference_pairs_per_sample=2, **common)
        trainer = MADPOTrainer(env=DialogueEnv(task), policies=policies, args=args)
    elif learner == "marlhf":  # a reward model (a copy of agent 0's model) fit on every item's pairs, then MAGRPO against it
        args = MARLHFConfig(num_generations=3, preference_num_candidates=3, reward_learning_rate=1e-2, reward_train_batch_size=2, **common)
        trainer = MARLHFTrainer(env=DialogueEnv(task), policies=policies, args=args)
    elif learner in ("iac", "maac", "iac_shared"):  # separate critics (copies of the agents' models), sharded too
        config, kind = (MAACConfig, MAACTrainer) if learner == "maac" else (IACConfig, IACTrainer)
        args = config(num_generations=2, critic_learning_rate=1e-2, value_clip_range=None, advantage_normalization=False,  # whitening is per rank
                      use_separate_critic=learner != "iac_shared", **common)
        trainer = kind(env=DialogueEnv(task), policies=policies, args=args)
    else:
        args = MAGRPOConfig(num_generations=3, reference_kl_enabled=reference, reference_kl_coef=0.5, **common)
        trainer = MAGRPOTrainer(env=DialogueEnv(task), policies=policies, args=args)
    probes, answers, grad_bytes, grads = [], [], {}, {a: [] for a in trainer.agents}
    critics = getattr(trainer, "critics", {})
    optimizers = {**trainer.optimizers, **{f"critic:{n}": o for n, o in getattr(trainer, "critic_optimizers", {}).items()}}
    grads.update({f"critic:{n}": [] for n in getattr(trainer, "critic_optimizers", {})})

    def critic_weights(name, critic):
        if getattr(critic, "shared", False):  # a head on the agent's own model
            return {f"head.{n}": p.detach().clone() for n, p in critic.head.named_parameters()}
        if team:  # a value adapter on the team's base, and a head: whole on every rank
            return {n: p.detach().clone() for n, p in critic.named_parameters()}
        shard = getattr(trainer, "sharded_critics", {}).get(name)
        from llm_marl.runs.fsdp import full_state_dict

        state = full_state_dict(shard.model) if shard is not None else {n: p.detach().clone() for n, p in critic.model.named_parameters()}
        return {**state, **{f"head.{n}": p.detach().clone() for n, p in critic.head.named_parameters()}}

    critic_start = {f"critic:{n}": critic_weights(n, c) for n, c in critics.items()}
    reward_model = getattr(trainer, "reward_model", None)
    if reward_model is not None:  # its optimizer's steps and weights are compared like a critic's
        optimizers["critic:reward_model"] = trainer.reward_optimizer
        grads["critic:reward_model"] = []

        def reward_weights():
            if getattr(trainer, "sharded_reward_model", None) is not None:
                from llm_marl.runs.fsdp import full_state_dict

                return full_state_dict(reward_model)
            return {n: p.detach().clone() for n, p in reward_model.named_parameters()}

        critic_start["critic:reward_model"] = reward_weights()
    collect = trainer._collect

    def probed_collect(indices):
        # inside the rollout's gathered window: what the sampler runs on right now
        with torch.no_grad():
            probes.append([trainer.policies[a].log_probs([PROBE[0]], [Completion(PROBE[1])]).item() for a in trainer.agents])
        roots, samples, elapsed = collect(indices)
        answers.append([c.token_ids for s in samples for c in s.completions])
        return roots, samples, elapsed

    trainer._collect = probed_collect
    grads_of = grads
    for agent, optimizer in optimizers.items():
        step = optimizer.step

        def measured_step(*a, _agent=agent, _step=step, _optimizer=optimizer, **k):
            grads = [p.grad for group in _optimizer.param_groups for p in group["params"]]
            grad_bytes[_agent] = max(grad_bytes.get(_agent, 0), local_nbytes(grads))
            full = [g.full_tensor() if hasattr(g, "full_tensor") else g.clone() for g in grads]  # every rank steps alike
            grads_of[_agent].append(full)
            return _step(*a, **k)

        optimizer.step = measured_step
    trainer.train(resume_from_checkpoint=resume)
    gathers = {a: s.gathers for a, s in trainer.sharded.items()}
    base_bytes = local_nbytes(p for p in policies[0].model.parameters() if not p.requires_grad)
    if team:  # the agents' weights are their adapters, whole on every rank; the base is frozen
        weights = {a: {n: p.detach().clone() for n, p in trainer.policies[a].named_parameters()} for a in trainer.agents}
        gathered, references = weights, {}
        if fsdp:
            from llm_marl.runs.fsdp import full_state_dict

            references = {"base": full_state_dict(trainer.sharded[trainer.agents[0]].model)}
        if save_to:
            trainer.save_model(save_to)
    elif fsdp:
        from llm_marl.runs.fsdp import full_state_dict

        weights = {a: full_state_dict(trainer.sharded[a].model) for a in trainer.agents}
        references = {a: full_state_dict(r.model) for a, r in trainer.sharded_references.items()}
        with trainer.gathered_weights():  # the gathered weights are the trained ones
            gathered = {a: {n: p.detach().clone() for n, p in trainer.policies[a].model.named_parameters()} for a in trainer.agents}
        if save_to:
            trainer.save_model(save_to)
    else:
        weights = {a: {n: p.detach().clone() for n, p in trainer.policies[a].model.named_parameters()} for a in trainer.agents}
        references = {a: r.model.state_dict() for a, r in (trainer.reference_policies or {}).items()}
        gathered = weights
    weights.update({f"critic:{n}": critic_weights(n, c) for n, c in critics.items()})
    if reward_model is not None:
        weights["critic:reward_model"] = reward_weights()
    gathered.update({f"critic:{n}": weights[f"critic:{n}"] for n in critics})
    return {
        "critic_start": critic_start,
        "critic_bytes": {"reward_model": local_nbytes(reward_model.backbone.parameters())} if reward_model is not None else
                        {} if team or learner == "iac_shared" else {n: local_nbytes(c.model.parameters()) for n, c in critics.items()},
        "critic_optimizer_bytes": {n.removeprefix("critic:"): local_nbytes(t for state in o.state.values() for t in state.values() if t.dim() > 0)
                                   for n, o in optimizers.items() if n.startswith("critic:")},
        "world_size": trainer.dist.world_size,
        "steps": trainer.state.global_step,
        "weights": weights,
        "gathered": gathered,
        "probes": probes,
        "answers": answers,
        "base_bytes": base_bytes,
        "param_bytes": {a: local_nbytes(trainer.policies[a].parameters() if team else trainer.policies[a].model.parameters()) for a in trainer.agents},
        "reference_bytes": {} if team else {a: local_nbytes(r.model.parameters()) for a, r in (trainer.reference_policies or {}).items()},
        "references": references,
        "kl": [v for _, m in trainer.logger.history for n, v in m.items() if n.endswith("kl_mean")],
        "grad_bytes": grad_bytes,
        "optimizer_bytes": {
            a: local_nbytes(t for state in o.state.values() for t in state.values() if t.dim() > 0) for a, o in trainer.optimizers.items()
        },
        "gathers": gathers,
        "grads": grads,
    }


def assert_trained_alike(sharded, single, start, atol=1e-6, min_close=0.9995):
    """The sharded run took the unsharded run's steps: gradients and weights (see below).
    ``atol``: of the gradients (actor-critic: a critic's rounding reaches the next advantages)."""
    # Each step's (clipped) gradient is the unsharded run's, to fp32 rounding.
    for agent, steps in single["grads"].items():
        assert len(steps) == len(sharded["grads"][agent]) == 2
        for expected, got in zip(steps, sharded["grads"][agent]):
            for e, g in zip(expected, got):
                assert torch.allclose(g, e, atol=atol, rtol=1e-3), (agent, (g - e).abs().max().item())
    # So are the weights after 2 AdamW steps, and training moved them. AdamW divides each
    # gradient element by its own magnitude: where a gradient is ~0 (GPT-2's key bias, whose
    # gradient is 0 up to rounding) rounding alone moves a weight by up to lr per step, so a few
    # elements may differ by that much; all others agree to fp32 rounding.
    lr, close, total = 1e-2, 0, 0
    for agent, expected in single["weights"].items():
        for name, value in expected.items():
            for got in (sharded["weights"][agent][name], sharded["gathered"][agent][name]):
                assert (got - value).abs().max().item() <= 2 * lr, (agent, name)
                close += int(torch.isclose(got, value, atol=2e-5, rtol=1e-4).sum())
                total += value.numel()
        moved = max((expected[n] - start[n]).abs().max().item() for n in expected)
        assert moved > 1e-3, f"{agent}'s weights did not move"
    assert close >= min_close * total, f"{total - close} of {total} weights ({1 - close / total:.3%}) differ beyond fp32 rounding"


def assert_iac_trained_alike(ranks, single, start, saved=None, team=False):
    """IAC (or MAAC) on 2 ranks, agents and separate critics sharded, took the unsharded run's
    steps: the actors' and the critics' gradients and weights (critic weights under the keys
    ``critic:<name>``, their value heads as ``head.*``); half the bytes per rank. ``team``: a
    LoRA team with value adapters, whole on every rank beside the team's half base."""
    for name, weights in single["critic_start"].items():
        start = {**start, **weights}
    # (gathered to rank 0) A critic's rounding reaches the next advantages, so more near-zero
    # gradients flip Adam's step than in MAGRPO: 0.065% of weights beyond rounding on an Intel Xeon
    # with AMX, fewer on an AMD EPYC; one attention projection of one model is 0.4% of them.
    assert_trained_alike(ranks[0], single, start, atol=1e-4, min_close=0.998)
    for rank in ranks:
        assert rank["steps"] == single["steps"] == 2
        if team:
            assert 0.45 * single["base_bytes"] <= rank["base_bytes"] <= 0.6 * single["base_bytes"]
            assert rank["critic_optimizer_bytes"] == single["critic_optimizer_bytes"] and all(single["critic_optimizer_bytes"].values())
            continue
        for what in ("param_bytes", "optimizer_bytes", "critic_bytes", "critic_optimizer_bytes"):
            for name, whole in single[what].items():
                assert 0.45 * whole <= rank[what][name] <= 0.6 * whole, (what, name, rank[what][name], whole)
    if saved is None:
        return
    # save_model: each critic's consolidated model and its head, from rank 0, reload to the trained weights.
    from llm_marl.policies.lm_critic import CausalLMCritic

    for i, name in enumerate(single["critic_start"]):
        critic = CausalLMCritic.from_pretrained(saved / f"agent_{i}" / "critic")
        trained = ranks[0]["weights"][name]
        for n, value in [*critic.model.named_parameters(), *((f"head.{k}", v) for k, v in critic.head.named_parameters())]:
            assert torch.equal(value, trained[n]), (name, n)


def assert_team_trained_alike(ranks, single, model_dir):
    """A LoRA team on 2 ranks (base sharded, adapters whole) took the unsharded run's steps."""
    start = {}
    for policy in lora_team(model_dir).policies.values():  # the adapters' seeded initial weights
        start.update(policy.state_dict())
    base = CausalLMPolicy.from_pretrained(model_dir).model.state_dict()
    for rank in ranks:
        assert rank["steps"] == single["steps"] == 2
        assert_trained_alike(rank, single, start)
        for got, expected in zip(rank["probes"], single["probes"], strict=True):  # the sampler is the trained policy
            assert got == pytest.approx(expected, abs=1e-4)
        # Per rank: half the frozen base's bytes; the adapters, their gradients and AdamW state whole.
        assert 0.45 * single["base_bytes"] <= rank["base_bytes"] <= 0.6 * single["base_bytes"], (rank["base_bytes"], single["base_bytes"])
        for what in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert rank[what] == single[what] and all(single[what].values()), what
    # The base stayed frozen (gathered from the shards to rank 0: the pretrained weights).
    frozen = {n.replace(".base_layer", ""): v for n, v in ranks[0]["references"]["base"].items() if ".lora_" not in n}
    assert len(frozen) >= 10 and frozen.keys() <= base.keys()
    assert all(torch.equal(v, base[n]) for n, v in frozen.items())
    assert ranks[0]["gathers"] == {a: 6 for a in single["weights"]}  # per batch: the rollout, one per agent's step


@pytest.fixture(scope="module")
def model_dir():
    return str(build_tiny_model(default_model_dir()))


def _free_port() -> int:
    with socket.socket() as probe:  # other test runs on this machine may hold a fixed port
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_ranks(script_text: str, tmp_path, nproc: int = 2) -> list[dict]:
    """Run ``script_text`` under torchrun on ``nproc`` gloo ranks; each rank's record (rank{r}.pt in
    ``tmp_path/ranks``, which ``{out}`` in the script names)."""
    script = tmp_path / "rank.py"
    script.write_text(script_text)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(_free_port()), str(script)],
        capture_output=True, text=True, timeout=400, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [torch.load(tmp_path / "ranks" / f"rank{r}.pt", weights_only=False) for r in range(nproc)]


def test_two_sharded_ranks_train_like_one_unsharded_process(tmp_path, model_dir):
    out, saved = tmp_path / "ranks", tmp_path / "saved"
    out.mkdir()
    team_saved = tmp_path / "team_saved"
    ranks = launch_ranks(RANK_SCRIPT.format(tests=TESTS, model_dir=model_dir, out=str(out), save_to=str(saved), run_dir=str(tmp_path / "run"),
                                            team_saved=str(team_saved), team_dir=str(tmp_path / "team_run"), iac_saved=str(tmp_path / "iac_saved")), tmp_path)
    single = run(model_dir)
    sharded = ranks[0]
    assert [r["world_size"] for r in ranks] == [2, 2] and single["world_size"] == 1
    assert sharded["steps"] == single["steps"] == 2

    start = CausalLMPolicy.from_pretrained(model_dir).model.state_dict()
    assert_trained_alike(sharded, single, start)

    # The reference models (sharded too) stayed frozen; the KL penalty they gave was active (its
    # values shaped the advantages behind the second step's gradient, equal above).
    for agent, reference in sharded["references"].items():
        for name, value in reference.items():
            assert torch.equal(value, start[name]), (agent, name)
    assert max(sharded["kl"]) > 0.1 and max(single["kl"]) > 0.1

    # The sampler is the trained policy: each rollout's gathered weights score the probe as the
    # unsharded run's current weights do (the probe changes between rollouts: steps in between).
    assert len(sharded["probes"]) == len(single["probes"]) == 2
    for got, expected in zip(sharded["probes"], single["probes"]):
        assert got == pytest.approx(expected, abs=1e-4)
    for before, after in zip(*sharded["probes"]):
        assert abs(before - after) > 1e-3, "the second rollout sampled from the weights before the step"
    assert sharded["gathers"] == {a: 4 for a in single["weights"]}  # per batch: the rollout and one step

    # Per rank: about half of the unsharded bytes of parameters, gradients and AdamW state.
    for what in ("param_bytes", "grad_bytes", "optimizer_bytes", "reference_bytes"):
        for agent, whole in single[what].items():
            for rank in ranks:
                assert 0.45 * whole <= rank[what][agent] <= 0.6 * whole, (what, agent, rank[what][agent], whole)

    # Stopped after step 1 and resumed from the sharded checkpoint (one file per rank, written by
    # torch.distributed.checkpoint): the same weights as the uninterrupted run.
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(sharded["checkpoint"])
    resumed = sharded["resumed"]
    assert resumed["steps"] == 2 and len(resumed["probes"]) == 1  # it rolled out batch 2 only
    for agent, weights in sharded["weights"].items():
        for name, value in weights.items():
            assert torch.equal(resumed["weights"][agent][name], value), (agent, name)

    # MADPO: the joint DPO loss over both sharded agents, margins against sharded references.
    single_dpo, dpo = run(model_dir, learner="madpo"), sharded["madpo"]
    assert dpo["steps"] == single_dpo["steps"] == 2
    assert_trained_alike(dpo, single_dpo, start)
    for agent, reference in dpo["references"].items():
        assert all(torch.equal(value, start[name]) for name, value in reference.items()), agent
    for what in ("param_bytes", "grad_bytes", "optimizer_bytes", "reference_bytes"):
        for agent, whole in single_dpo[what].items():
            assert 0.45 * whole <= dpo[what][agent] <= 0.6 * whole, (what, agent, dpo[what][agent], whole)

    # fsdp_gather="layer" samples exactly what gathering whole models samples and trains alike,
    # also where one rank has no item (it runs dummy passes while the other decodes) and for a
    # LoRA team; it never gathers a whole model to sample (2 gathers: the 2 update steps).
    for rank in ranks:
        for layer, whole in ((rank["layer"], rank["layer_model"]), (rank["team_layer"], rank["team"])):
            assert layer["answers"] == whole["answers"] and layer["probes"] == whole["probes"]
            assert all(torch.equal(g, e) for a in whole["grads"] for gs, es in zip(layer["grads"][a], whole["grads"][a]) for g, e in zip(gs, es))
        assert [len(a) for a in rank["layer"]["answers"]] == ([6, 6] if rank is ranks[0] else [6, 0])
        assert rank["layer"]["gathers"] == {a: 2 for a in single["weights"]}
    for agent, weights in ranks[0]["layer_model"]["weights"].items():
        assert all(torch.equal(ranks[0]["layer"]["weights"][agent][n], v) for n, v in weights.items()), agent

    # mixed_precision: the gathered weights are bf16 copies, the shards, gradients and AdamW
    # state stay fp32 (half the unsharded fp32 bytes per rank); training moved the weights.
    # (bf16 sampling draws other answers, so no equality with the fp32 run is asserted.)
    for rank in ranks:
        bf16 = rank["bf16"]
        assert bf16["steps"] == 2 and {v.dtype for g in bf16["gathered"].values() for v in g.values()} == {torch.bfloat16}
        assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for steps in bf16["grads"].values() for step in steps for g in step)
        for what in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert bf16[what] == sharded[what], what  # fp32 shards (1/2 of fp32), not bf16 (1/4)
    assert {v.dtype for w in ranks[0]["bf16"]["weights"].values() for v in w.values()} == {torch.float32}
    assert max((w[n] - start[n]).abs().max().item() for w in ranks[0]["bf16"]["weights"].values() for n in w) > 1e-3
    assert_iac_trained_alike([r["iac"] for r in ranks], run(model_dir, learner="iac"), start, tmp_path / "iac_saved")
    assert_team_trained_alike([r["team"] for r in ranks], run(model_dir, team=True), model_dir)
    # The team stopped after step 1 and resumed (the adapters and their optimizers saved whole, as
    # without fsdp): the uninterrupted run's adapters.
    team, resumed = sharded["team"], sharded["team_resumed"]
    assert resumed["steps"] == 2 and len(resumed["probes"]) == 1
    for agent, weights in team["weights"].items():
        for name, value in weights.items():
            assert torch.equal(resumed["weights"][agent][name], value), (agent, name)
    # save_model: each agent's adapter in peft's format, from rank 0; it reloads onto the base.
    reloaded = LoRATeam.from_pretrained(model_dir, agents=("a0", "a1"), adapters={"a0": team_saved / "agent_0", "a1": team_saved / "agent_1"})
    for i, (agent, name) in enumerate(zip(team["weights"], ("a0", "a1"))):
        assert (team_saved / f"agent_{i}" / "adapter_model.safetensors").is_file()
        got = reloaded.policies[name].state_dict()
        assert got.keys() == team["weights"][agent].keys()
        assert all(torch.equal(got[n], v) for n, v in team["weights"][agent].items()), agent

    # save_model: one consolidated Hugging Face folder per agent, from rank 0, holding the trained weights.
    for i, agent in enumerate(single["weights"]):
        reloaded = CausalLMPolicy.from_pretrained(saved / f"agent_{i}").model
        assert type(reloaded).__name__ == "GPT2LMHeadModel"
        for name, value in reloaded.state_dict().items():
            if name in sharded["weights"][agent]:
                assert torch.equal(value, sharded["weights"][agent][name]), (agent, name)


MESH_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from test_fsdp import run
result = run({model_dir!r}, fsdp=True, shard_size=2, items=8, items_per_step=1, rollout_buffer_size=1)
torch.save(result, os.path.join({out!r}, f"rank{{os.environ['RANK']}}.pt"))
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
"""


def test_a_2d_mesh_shards_in_pairs_and_replicates_across_them(tmp_path, model_dir):
    """4 ranks, ``fsdp_shard_size=2``: two groups of 2 shard, the groups replicate (HSDP). The 4
    ranks' items train like one unsharded process on all of them; each rank holds half."""
    out = tmp_path / "ranks"
    out.mkdir()
    ranks = launch_ranks(MESH_SCRIPT.format(tests=TESTS, model_dir=model_dir, out=str(out)), tmp_path, nproc=4)
    single = run(model_dir, items=8, items_per_step=4, rollout_buffer_size=4)
    assert [r["world_size"] for r in ranks] == [4] * 4 and ranks[0]["steps"] == single["steps"] == 2
    assert_trained_alike(ranks[0], single, CausalLMPolicy.from_pretrained(model_dir).model.state_dict())
    for what in ("param_bytes", "grad_bytes", "optimizer_bytes", "reference_bytes"):
        for agent, whole in single[what].items():
            for rank in ranks:
                assert 0.45 * whole <= rank[what][agent] <= 0.6 * whole, (what, agent, rank[what][agent], whole)


CRITIC_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from test_fsdp import run
iac = dict(learner="iac", fsdp=True, items_per_step=1, rollout_buffer_size=1)
result = {{"iac": run({model_dir!r}, **iac), "iac_layer": run({model_dir!r}, gather="layer", **iac)}}
run({model_dir!r}, output_dir={run_dir!r}, max_steps=1, **iac)
result["checkpoint"] = sorted(os.listdir(os.path.join({run_dir!r}, "checkpoint-1")))
result["iac_resumed"] = run({model_dir!r}, output_dir={run_dir!r}, resume=True, **iac)
result["maac"] = run({model_dir!r}, learner="maac", fsdp=True, items_per_step=1, rollout_buffer_size=1)
result["team_iac"] = run({model_dir!r}, learner="iac", team=True, fsdp=True, items_per_step=1, rollout_buffer_size=1)
shared = dict(learner="iac_shared", fsdp=True, items_per_step=1, rollout_buffer_size=1)  # value heads on the agents' own models
result["shared"] = run({model_dir!r}, **shared)
run({model_dir!r}, output_dir={shared_dir!r}, max_steps=1, **shared)
result["shared_resumed"] = run({model_dir!r}, output_dir={shared_dir!r}, resume=True, **shared)
rlhf = dict(learner="marlhf", fsdp=True, items_per_step=1, rollout_buffer_size=1)  # its reward model sharded
result["marlhf"] = run({model_dir!r}, save_to={rlhf_saved!r}, **rlhf)
run({model_dir!r}, output_dir={rlhf_dir!r}, max_steps=1, **rlhf)
result["marlhf_checkpoint"] = sorted(os.listdir(os.path.join({rlhf_dir!r}, "checkpoint-1")))
result["marlhf_resumed"] = run({model_dir!r}, output_dir={rlhf_dir!r}, resume=True, **rlhf)
torch.save(result, os.path.join({out!r}, f"rank{{os.environ['RANK']}}.pt"))
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
"""


def test_sharded_critics_resume_exactly_and_maac_and_a_team_train_like_one_process(tmp_path, model_dir):
    """IAC stopped after one step and resumed from its checkpoint (critics' shards, heads and
    optimizer states through ``torch.distributed.checkpoint``) equals the uninterrupted run;
    MAAC's one central critic, sharded, and IAC on a LoRA team (value adapters on the sharded
    base) train like one unsharded process."""
    out = tmp_path / "ranks"
    out.mkdir()
    ranks = launch_ranks(CRITIC_SCRIPT.format(tests=TESTS, model_dir=model_dir, out=str(out), run_dir=str(tmp_path / "run"), shared_dir=str(tmp_path / "shared"),
                                              rlhf_saved=str(tmp_path / "rlhf_saved"), rlhf_dir=str(tmp_path / "rlhf")), tmp_path)
    assert {"critic_0_shards", "critic_1_shards"} <= set(ranks[0]["checkpoint"])
    for rank in ranks:  # fsdp_gather="layer" with critics (their values in the rollout): the same answers and steps
        layer, whole = rank["iac_layer"], rank["iac"]
        assert layer["answers"] == whole["answers"] and layer["probes"] == whole["probes"]
        assert all(torch.equal(g, e) for a in whole["grads"] for gs, es in zip(layer["grads"][a], whole["grads"][a]) for g, e in zip(gs, es))
    assert "reward_model_shards" in ranks[0]["marlhf_checkpoint"]
    pairs = ((ranks[0]["iac"], ranks[0]["iac_resumed"]), (ranks[0]["shared"], ranks[0]["shared_resumed"]), (ranks[0]["marlhf"], ranks[0]["marlhf_resumed"]))
    for uninterrupted, resumed in pairs:
        assert resumed["steps"] == 2 and len(resumed["probes"]) == 1  # it rolled out batch 2 only
        assert resumed["weights"].keys() == uninterrupted["weights"].keys() and len(resumed["weights"]) in (3, 4)  # 2 agents, 2 critics or a reward model
        for key, weights in uninterrupted["weights"].items():
            for name, value in weights.items():
                assert torch.equal(resumed["weights"][key][name], value), (key, name)
    start = CausalLMPolicy.from_pretrained(model_dir).model.state_dict()
    # MARLHF: every rank fits the sharded reward model on rank 0's pairs (all items' pairs, as one
    # process does): each fit step's gradient is one process's exactly, and so are the weights;
    # the agents' first step too. (The second rollout's answers may differ by a token: AdamW's
    # rounding amplification moves the agents' weights by ~1e-4, enough to flip a sampled token.)
    single = run(model_dir, learner="marlhf")
    for rank in ranks:
        rlhf = rank["marlhf"]
        assert rlhf["steps"] == single["steps"] == 2 and len(rlhf["grads"]["critic:reward_model"]) == len(single["grads"]["critic:reward_model"]) == 6
        for key in ("critic:reward_model", "agent_0", "agent_1"):
            for expected, got in list(zip(single["grads"][key], rlhf["grads"][key]))[: None if key.startswith("critic") else 1]:
                assert all(torch.allclose(g, e, atol=1e-6, rtol=1e-4) for e, g in zip(expected, got)), key
        for what in ("param_bytes", "optimizer_bytes", "critic_bytes", "critic_optimizer_bytes"):
            for name, whole in single[what].items():
                assert 0.45 * whole <= rlhf[what][name] <= 0.6 * whole, (what, name, rlhf[what][name], whole)
    trained = ranks[0]["marlhf"]["weights"]["critic:reward_model"]
    assert all(torch.allclose(trained[n], v, atol=1e-6) for n, v in single["weights"]["critic:reward_model"].items())
    saved = torch.load(tmp_path / "rlhf_saved" / "reward_model" / "reward_model.pt", weights_only=False)  # consolidated by rank 0
    assert saved.keys() == trained.keys() and all(torch.equal(saved[n], v) for n, v in trained.items())
    # use_separate_critic=False: each value head on its agent's sharded model, trained in the agent's step.
    assert_iac_trained_alike([r["shared"] for r in ranks], run(model_dir, learner="iac_shared"), start)
    assert_iac_trained_alike([r["maac"] for r in ranks], run(model_dir, learner="maac"), start)
    # IAC on a LoRA team: the critics are value adapters on the team's sharded base.
    adapters = {}
    for policy in lora_team(model_dir).policies.values():
        adapters.update(policy.state_dict())
    assert_iac_trained_alike([r["team_iac"] for r in ranks], run(model_dir, learner="iac", team=True), adapters, team=True)


def test_fsdp_with_mp_placement_is_one_line_error():
    with pytest.raises(ValueError, match='fsdp=True .* parallel_training="mp"'):
        MAGRPOConfig(fsdp=True, parallel_training="mp", agent_devices=["cpu", "cpu"])
    with pytest.raises(ValueError, match="mixed_precision=True .* needs fsdp=True"):
        MAGRPOConfig(mixed_precision=True)


def test_fsdp_refuses_tabular_policies_and_a_missing_process_group(model_dir):
    args = dict(num_turns=1, num_generations=2, fsdp=True, progress_bar=False)
    with pytest.raises(ValueError, match="agent 'left' has a TabularPolicy"):
        MAGRPOTrainer(env=DialogueEnv(ColourMatch(num_items=2, num_turns=1)), policies=[TabularPolicy(MENU), TabularPolicy(MENU)], args=MAGRPOConfig(**args))
    lms = [CausalLMPolicy.from_pretrained(model_dir, max_new_tokens=2) for _ in range(2)]
    with pytest.raises(ValueError, match="fsdp=True needs a torchrun process group"):
        MAGRPOTrainer(env=DialogueEnv(ColourMatch(num_items=2, num_turns=1)), policies=lms, args=MAGRPOConfig(**args))
    with pytest.raises(ValueError, match="fsdp=True needs a torchrun process group"):  # the CoMLRL-style constructor
        MAGRPOTrainer(agent_model=model_dir, reward_func=length_reward, formatters=lambda item: item["prompt"],
                      train_dataset=[{"prompt": p} for p in PROMPTS], args=MAGRPOConfig(**args))


def test_cli_fsdp_flag_reaches_the_trainer(tmp_path, capsys):
    from llm_marl.cli import main

    code = main(["train", "--env", "ClimbingGame-v0", "--fsdp", "true", "--output_dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code in (1, 2) and "fsdp=True shards language-model agents" in err and "TabularPolicy" in err, err
    assert "Traceback" not in err
    code = main(["train", "--env", "ClimbingGame-v0", "--fsdp", "--output_dir", str(tmp_path / "s")])  # the flag alone: true
    err = capsys.readouterr().err
    assert code in (1, 2) and "fsdp=True shards language-model agents" in err, err
