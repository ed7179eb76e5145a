"""llm_marl.assembly: the command and the drop-in constructor build the same agents from the same
settings, and refuse the same sources with the same message in their own words."""

from __future__ import annotations

import pytest

from llm_marl import assembly
from llm_marl.cli import UsageError, build_trainer
from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer
from llm_marl.policies.causal_lm import CausalLMPolicy
from llm_marl.policies.lora_team import AdapterPolicy
from llm_marl.policies.tiny import build_tiny_model, default_model_dir

SAMPLING = {"max_new_tokens": 5, "temperature": 0.9, "top_p": 0.8, "top_k": 7, "generation_batch_size": 3}


@pytest.fixture(scope="module")
def tiny():
    return str(build_tiny_model(default_model_dir()))


def both_ways(tiny, **fields):
    """The agents' policies from the command's options and from the constructor's keywords."""
    cli = build_trainer({"env": "WritingCollab-v0", "policy": "lm", "model": tiny, "num_turns": 1, "train_items": 2,
                         "progress_bar": False, **SAMPLING, **fields})
    drop_in = MAGRPOTrainer(agent_model=tiny, reward_func=lambda a, b: [0.0] * len(a), train_dataset=[{"prompt": "x"}],
                            args=MAGRPOConfig(num_turns=1, progress_bar=False, **SAMPLING, **fields))
    return list(cli.policies.values()), list(drop_in.policies.values())


@pytest.mark.parametrize("fields, kind", [({}, CausalLMPolicy), ({"lora_r": 2, "lora_target_modules": ["c_attn"]}, AdapterPolicy)])
def test_the_command_and_the_drop_in_constructor_build_the_same_agents(tiny, fields, kind):
    # Planted bug caught: either caller dropping a config field (e.g. generation_batch_size) on its way to the policies.
    cli, drop_in = both_ways(tiny, **fields)
    expected = {"max_new_tokens": 5, "temperature": 0.9, "top_p": 0.8, "top_k": 7, "max_batch_size": 3, "sample_dtype": None}
    for first, second in (cli, drop_in):
        assert type(first) is type(second) is kind
        assert {f: getattr(first, f) for f in expected} == {f: getattr(second, f) for f in expected} == expected
        if kind is AdapterPolicy:
            assert first.team is second.team
        else:
            assert first.model is not second.model


def test_a_misspelt_model_name_reads_the_same_from_both_in_their_words():
    with pytest.raises(assembly.AssemblyError) as shared:
        assembly.build_policies(["agent_0", "agent_1"], "smollm2-135n", MAGRPOConfig(), label="agent_model")
    with pytest.raises(ValueError) as drop_in:
        # one turn: CoMLRL checks a second turn's external_transition before the model
        MAGRPOTrainer(agent_model="smollm2-135n", reward_func=lambda a, b: [0.0], train_dataset=[{"prompt": "x"}], args=MAGRPOConfig(num_turns=1))
    with pytest.raises(UsageError) as cli:
        build_trainer({"env": "WritingCollab-v0", "policy": "lm", "model": "smollm2-135n", "num_turns": 1})
    assert str(drop_in.value) == str(shared.value)
    assert str(cli.value) == str(shared.value).replace("agent_model ", "--model ", 1)
    assert "did you mean smollm2-135m?" in str(cli.value) and str(cli.value).startswith("--model smollm2-135n:")


def test_one_function_builds_every_kind_of_policy_and_refuses_the_rest_for_the_command():
    # Planted bugs caught: make_policies losing the tabular kind or the menu, an unknown --policy
    # slipping through to the language-model path, the one-base check for adapters dropped.
    from llm_marl.envs import make
    from llm_marl.policies.tabular import TabularPolicy

    env = make("ClimbingGame-v0")
    built = assembly.make_policies("tabular", env.possible_agents, MAGRPOConfig(), env=env, env_id="ClimbingGame-v0", actions="x,y")
    assert [type(p) for p in built.policies] == [TabularPolicy, TabularPolicy] and built.tokenizers == [None, None]
    assert [p.actions for p in built.policies] == [["x", "y"], ["x", "y"]]
    with pytest.raises(assembly.AssemblyError, match=r"^unknown --policy 'mlp'; choose tabular or lm$"):
        assembly.make_policies("mlp", env.possible_agents, MAGRPOConfig(), env=env)
    with pytest.raises(UsageError, match=r"^unknown --policy 'mlp'; choose tabular or lm$"):
        build_trainer({"env": "ClimbingGame-v0", "policy": "mlp"})
    with pytest.raises(UsageError, match=r"^--lora_r: the agents are adapters of ONE base model; give one --model, not 'a,b'$"):
        build_trainer({"env": "WritingCollab-v0", "policy": "lm", "model": "a,b", "lora_r": 2, "num_turns": 1})
