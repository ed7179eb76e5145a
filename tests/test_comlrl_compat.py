"""llm_marl.comlrl: CoMLRL 1.4.x's import paths and call conventions, case by case.

The end-to-end run of a migrated companion-style script is tests/test_comlrl_script.py; here each
convention is pinned on its own: RewardProcessors as CoMLRL documents them, every reward-function
form of CoMLRL's reward caller, both eval-logger forms, one-entry device lists, the optimizer
CoMLRL builds, train_dataset needed only by train(), evaluate(num_eval_samples=), dataset_type=,
CoMLRL's train() signature, default run directories and W&B (missing package; report_to).
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from pathlib import Path

import datasets
import pytest
import torch

from llm_marl.comlrl.trainers import reinforce as comlrl_reinforce
from llm_marl.comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer, MAReMaxConfig, MARLOOConfig
from llm_marl.comlrl.utils.reward_processor import RewardProcessors
from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.comlrl.anchor_compat import adapt_eval_logger
from llm_marl.runs.run_dir import default_run_dir
from llm_marl.tasks.function_task import FunctionTask

ROWS = [
    {"prompt": "def add(a, b):", "entry_point": "add", "test": "assert add(1, 2) == 3"},
    {"prompt": "def neg(x):", "entry_point": "neg"},
]


# --- import paths -----------------------------------------------------------------------------


def test_import_paths_mirror_comlrl():
    from llm_marl.comlrl.trainers import MAGRPOTrainer as from_trainers
    from llm_marl.comlrl.trainers.reinforce.magrpo import MAGRPOConfig as from_module
    from llm_marl.comlrl.trainers.reinforce.mareinforce import MAREINFORCEConfig, MAREINFORCETrainer
    from llm_marl.comlrl.trainers.reinforce.maremax import MAReMaxTrainer
    from llm_marl.comlrl.trainers.reinforce.marloo import MARLOOTrainer
    from llm_marl.comlrl.utils import RewardProcessors as from_utils
    import llm_marl.learners as learners

    assert from_trainers is MAGRPOTrainer and from_module is MAGRPOConfig and from_utils is RewardProcessors
    # thin adapters over the learners: same family, baselines unchanged
    for trainer, base in [(MAGRPOTrainer, learners.MAGRPOTrainer), (MAREINFORCETrainer, learners.MAREINFORCETrainer),
                          (MARLOOTrainer, learners.MARLOOTrainer), (MAReMaxTrainer, learners.MAReMaxTrainer)]:
        assert issubclass(trainer, base)
    assert [c().advantage_mode for c in (MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, MAReMaxConfig)] == ["mean", "raw", "rloo", "max"]
    assert set(comlrl_reinforce.__all__) == {f"{n}{k}" for n in ("MAGRPO", "CentralizedMAGRPO", "MAREINFORCE", "MARLOO", "MAReMax")
                                             for k in ("Config", "Trainer")}


# --- RewardProcessors (CoMLRL: scale(factor=1.0) multiplies, shift(value=0.0) adds) -------------


@pytest.mark.parametrize("reward", [0.0, 1.5, -2.25, 4, 1e6])
def test_defaults_are_the_identity(reward):
    assert RewardProcessors.scale()(reward) == reward
    assert RewardProcessors.shift()(reward) == reward


@pytest.mark.parametrize(
    "processor, reward, expected",
    [
        (RewardProcessors.scale(2), 1.5, 3.0),
        (RewardProcessors.scale(factor=0.5), 4.0, 2.0),
        (RewardProcessors.scale(factor=-1), 2.5, -2.5),
        (RewardProcessors.scale(0), 7.0, 0.0),
        (RewardProcessors.shift(-4), 4.0, 0.0),
        (RewardProcessors.shift(value=0.5), -1.0, -0.5),
        (RewardProcessors.shift(value=-4), 3.8, 3.8 - 4),
    ],
)
def test_scale_multiplies_and_shift_adds(processor, reward, expected):
    assert processor(reward) == expected


def test_composition_as_companion_scripts_write_it():
    scale, shift = RewardProcessors.scale(factor=0.5), RewardProcessors.shift(value=-4)
    scale_then_shift = (lambda p=scale, s=shift: (lambda x: s(p(x))))()
    assert scale_then_shift(8.0) == 0.0  # 8 * 0.5 - 4
    assert scale(shift(8.0)) == 2.0  # the other order differs: (8 - 4) * 0.5
    # each processor keeps its own argument
    double, triple = RewardProcessors.scale(2), RewardProcessors.scale(3)
    assert (double(1.0), triple(1.0)) == (2.0, 3.0)


@pytest.mark.parametrize("bad", ["2", None, math.nan, math.inf, True])
def test_invalid_arguments_are_refused_when_made(bad):
    with pytest.raises(ValueError, match="factor must be a finite real number"):
        RewardProcessors.scale(bad)
    with pytest.raises(ValueError, match="value must be a finite real number"):
        RewardProcessors.shift(value=bad)


# --- reward-function forms (CoMLRL's reward caller) -------------------------------------------


def play(reward_func, num_agents=2, num_turns=1, transition=None, formatter=None):
    """Step one item through a FunctionTask env: answers "x", "y" (..), then "u", "v"."""
    formatter = formatter or (lambda item, external_prompts=None: external_prompts or f"P:{item['prompt']}")
    task = FunctionTask(reward_func, formatter, transition, ROWS, num_agents=num_agents, num_turns=num_turns)
    env = DialogueEnv(task)
    observations, _ = env.reset(options={"index": 0})
    seen = [observations]
    for answers in (["x", "y", "z"], ["u", "v", "w"])[:num_turns]:
        observations, rewards, *_ = env.step({a: answers[i] for i, a in enumerate(env.agents)})
        seen.append(observations)
    return seen


def test_reward_forms_two_agents():
    calls = {}

    def positional(c1, c2):
        calls["positional"] = (c1, c2)
        return [1.0]

    def with_items(c1, c2, batch_items=None):
        calls["with_items"] = (c1, c2, batch_items)
        return [1.0]

    def prompts_first(prompts, c1, c2):
        calls["prompts_first"] = (prompts, c1, c2)
        return [1.0]

    def prompts_keyword(c1, c2, prompts=None, batch_items=None):
        calls["prompts_keyword"] = (c1, c2, prompts, batch_items)
        return [1.0]

    def one_list(completions):
        calls["one_list"] = completions
        return [1.0]

    def star(*completions, **kwargs):
        calls["star"] = (completions, kwargs)
        return [1.0]

    for fn in (positional, with_items, prompts_first, prompts_keyword, one_list, star):
        play(fn)
    item = ROWS[0]
    prompt = [f"P:{item['prompt']}"]  # agent 0's prompt at this turn
    assert calls["positional"] == (["x"], ["y"])
    assert calls["with_items"] == (["x"], ["y"], [item])  # CoMLRL 1.4.3's aligned mode drops these items
    assert calls["prompts_first"] == (prompt, ["x"], ["y"])
    assert calls["prompts_keyword"] == (["x"], ["y"], prompt, [item])
    assert calls["one_list"] == [["x"], ["y"]]
    assert calls["star"] == ((["x"], ["y"]), {"batch_items": [item], "prompts": prompt})


def test_reward_forms_one_agent():
    calls = []
    play(lambda c: calls.append(("c", c)) or [1.0], num_agents=1)
    play(lambda prompts, c: calls.append(("pc", prompts, c)) or [1.0], num_agents=1)
    assert calls == [("c", ["x"]), ("pc", ["P:def add(a, b):"], ["x"])]


def test_reward_prompts_at_a_later_turn_are_the_transitions_without_calling_it_again():
    transitions, rewards = [], []

    def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        transitions.append(agent_completions)
        return [f"feedback {len(transitions)} for agent {i}" for i in range(num_agents)]

    def reward(prompts, c1, c2):
        rewards.append((prompts, c1, c2))
        return [0.5]

    seen = play(reward, num_turns=2, transition=transition)
    assert rewards == [(["P:def add(a, b):"], ["x"], ["y"]), (["feedback 1 for agent 0"], ["u"], ["v"])]
    assert seen[1]["agent_0"] == "feedback 1 for agent 0"  # what agent 0 was shown at turn 2
    assert transitions == [["x", "y"]]  # the reward's prompt came from memory, not a second call


def test_reward_prompts_are_recomputed_when_the_transition_ran_elsewhere():
    transitions = []

    def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        transitions.append(list(agent_completions))
        return [f"saw {agent_completions[0]}", "other"]

    received = []
    task = FunctionTask(lambda prompts, a, b: received.append(prompts) or [1.0], lambda item: item["prompt"], transition, ROWS, num_turns=2)
    env = DialogueEnv(task)
    env.reset(options={"index": 0})
    env.step({"agent_0": "x", "agent_1": "y"})
    task._next_prompts.clear()  # as if the transition had run in another process
    env.step({"agent_0": "u", "agent_1": "v"})
    assert received == [[ROWS[0]["prompt"]], ["saw x"]]
    assert transitions == [["x", "y"], ["x", "y"]]


# --- eval loggers: 1.4.3 and 1.4.2 forms ----------------------------------------------------


def test_eval_logger_forms_are_chosen_from_the_signature():
    calls = {}
    turns = [[["a0"]], [["b0"]]]
    items = [dict(ROWS[0]), dict(ROWS[1])]
    prompts = [item["prompt"] for item in items]

    def v143(agent_completions_turns, batch_items, prompts):
        calls["1.4.3"] = (agent_completions_turns, batch_items, prompts)
        return []

    def v142(agent_completions_turns, test_cases, entry_points, prompts=None):
        calls["1.4.2"] = (agent_completions_turns, test_cases, entry_points, prompts)
        return []

    def v142_no_prompts(agent_completions_turns, test_cases, entry_points):
        calls["1.4.2-"] = (agent_completions_turns, test_cases, entry_points)
        return []

    def keyword_only(*, agent_completions_turns, **_):
        calls["kw"] = (agent_completions_turns, _)
        return []

    for logger in (v143, v142, v142_no_prompts, keyword_only):
        adapt_eval_logger(logger)(agent_completions_turns=turns, batch_items=items, prompts=prompts)
    assert calls["1.4.3"] == (turns, items, prompts)
    assert calls["1.4.2"] == (turns, ["assert add(1, 2) == 3", ""], ["add", "neg"], prompts)  # "" when absent
    assert calls["1.4.2-"] == (turns, ["assert add(1, 2) == 3", ""], ["add", "neg"])
    assert calls["kw"] == (turns, {"batch_items": items, "prompts": prompts})
    assert adapt_eval_logger(v142).form == "1.4.2" and adapt_eval_logger(v143).form == "1.4.3"
    assert adapt_eval_logger(None) is None
    with pytest.raises(TypeError, match="eval_logger must be callable"):
        adapt_eval_logger("not a function")


# --- config conventions ---------------------------------------------------------------------


def test_one_device_entry_is_for_every_agent():
    from llm_marl.learners.config import MAGRPOConfig as NativeConfig

    assert MAGRPOConfig(num_agents=3, agent_devices=["cpu"]).agent_devices == ["cpu"] * 3
    assert NativeConfig(num_agents=2, agent_devices=["cpu"], reference_devices=["cpu"]).reference_devices == ["cpu", "cpu"]
    assert MAGRPOConfig(agent_devices="auto").agent_devices == ["cuda:0" if torch.cuda.is_available() else "cpu"] * 2
    assert MAGRPOConfig(parallel_training="null").parallel_training == "none"
    with pytest.raises(ValueError, match="agent_devices must list one device per agent"):
        MAGRPOConfig(num_agents=2, agent_devices=["cpu", "cpu", "cpu"])


def test_comlrl_configs_default_to_the_optimizer_comlrl_builds():
    from llm_marl.learners.config import MAGRPOConfig as NativeConfig

    torch_default = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]).defaults["weight_decay"]
    assert torch_default == 0.01
    for config in (MAGRPOConfig, MARLOOConfig, MAReMaxConfig, comlrl_reinforce.MAREINFORCEConfig):
        assert config().weight_decay == torch_default
    assert NativeConfig().weight_decay == 0.0  # llm_marl's own default is unchanged


# --- trainers built from tiny models ---------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from llm_marl.policies.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", pretrain_steps=0))


@pytest.fixture(autouse=True)
def in_tmp_dir(tmp_path, monkeypatch):
    """Default run directories land in tmp; W&B runs are offline files."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def args(config=MAGRPOConfig, **overrides):
    settings = dict(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=3, temperature=1.0, top_p=1.0,
                    top_k=None, rollout_buffer_size=2, eval_interval=0, eval_num_samples=2, progress_bar=False,
                    early_termination_threshold=None, agent_learning_rate=1e-3)
    settings.update(overrides)
    return config(**settings)


def test_the_optimizer_is_torch_adamw_with_its_defaults(tiny):
    trainer = MAGRPOTrainer(agent_model=tiny, reward_func=lambda a, b: [1.0], train_dataset=ROWS, args=args())
    reference = torch.optim.AdamW(trainer.policies["agent_0"].parameters(), lr=1e-3)
    assert len(trainer.optimizers) == 2  # CoMLRL's list, by agent position
    for optimizer in trainer.optimizers:
        assert isinstance(optimizer, torch.optim.AdamW)
        [group] = optimizer.param_groups
        for key in ("lr", "weight_decay", "betas", "eps", "amsgrad"):
            assert group[key] == reference.defaults[key], key


def test_train_dataset_is_needed_only_by_train_and_num_eval_samples(tiny):
    seen = []

    def logger(agent_completions_turns, batch_items, prompts):
        seen.append(len(batch_items))
        return [{"n": 1.0} for _ in batch_items]

    trainer = MAGRPOTrainer(agent_model=tiny, reward_func=lambda a, b: [1.0], eval_dataset=ROWS, eval_logger=logger,
                            eval_aggregator=lambda metrics, num_turns=1: {"count": len(metrics)}, args=args())
    assert trainer.evaluate(num_eval_samples=1)["eval/count"] == 1
    assert trainer.evaluate()["eval/count"] == 2  # eval_num_samples
    assert seen == [1, 2]
    with pytest.raises(ValueError, match="num_eval_samples must be an int >= 0"):
        trainer.evaluate(num_eval_samples=-1)
    with pytest.raises(ValueError, match="train_dataset is required to train"):
        trainer.train()
    without_data = MAGRPOTrainer(agent_model=tiny, reward_func=lambda a, b: [1.0], args=args())  # CoMLRL builds it too
    with pytest.raises(ValueError, match="train_dataset is required to train"):
        without_data.train()


def test_dataset_type_is_deprecated_but_accepted(tiny):
    with pytest.warns(DeprecationWarning, match="dataset_type= was accepted by CoMLRL 1.4.0-1.4.2"):
        MAGRPOTrainer(agent_model=tiny, reward_func=lambda a, b: [1.0], train_dataset=ROWS, dataset_type="humaneval", args=args())


def test_comlrl_train_signature(tiny):
    trainer = MAGRPOTrainer(agent_model=tiny, reward_func=lambda a, b: [1.0], train_dataset=ROWS[:1], args=args())
    with pytest.raises(ValueError, match="checkpoint_interval=2 .* save_steps"):
        trainer.train(checkpoint_interval=2)
    with pytest.raises(ValueError, match="checkpoint_dir='elsewhere'.*output_dir"):
        trainer.train(checkpoint_dir="elsewhere")
    state = trainer.train(checkpoint_total_limit=1, checkpoint_dir=trainer.args.output_dir)
    assert trainer.args.save_total_limit == 1 and state.epoch == 1


def test_no_output_dir_gets_a_named_default_run_directory(tiny, tmp_path, capsys):
    trainer = MAGRPOTrainer(agent_model=tiny, reward_func=lambda a, b: [1.0], train_dataset=ROWS[:1], args=args())
    out = capsys.readouterr().out
    directory = trainer.args.output_dir
    assert directory.startswith(os.path.join("runs", "magrpo-"))
    assert f"no output_dir given: this run is recorded in {directory}" in out
    trainer.train()
    assert {"logs", "metrics.jsonl"} <= set(os.listdir(directory))
    assert not any(name.startswith("checkpoint-") for name in os.listdir(directory))  # weights only when asked (issue 24)
    # named after the algorithm (or the W&B run's name)
    other = comlrl_reinforce.MARLOOTrainer(agent_model=tiny, reward_func=lambda a, b: [1.0], train_dataset=ROWS[:1],
                                           args=args(config=MARLOOConfig))
    assert other.args.output_dir.startswith(os.path.join("runs", "marloo-"))
    named = MAGRPOTrainer(agent_model=tiny, reward_func=lambda a, b: [1.0], train_dataset=ROWS[:1], args=args(),
                          wandb_config={"name": "my run"})
    named.wandb.finish()
    assert named.args.output_dir.startswith(os.path.join("runs", "my_run-"))
    # an explicit output_dir is kept
    kept = MAGRPOTrainer(agent_model=tiny, reward_func=lambda a, b: [1.0], train_dataset=ROWS[:1], args=args(output_dir="mine"))
    assert kept.args.output_dir == "mine"


def test_default_run_dir_names(tmp_path):
    first = default_run_dir("ClimbingGame-v0", "magrpo", root=str(tmp_path), stamp="20260101-000000")
    assert first == str(tmp_path / "ClimbingGame-v0-magrpo-20260101-000000")
    os.makedirs(first)
    assert default_run_dir("ClimbingGame-v0", "magrpo", root=str(tmp_path), stamp="20260101-000000") == first + "-2"
    assert Path(default_run_dir("pkg.mod:factory", "my run/1", root=str(tmp_path), stamp="s")).name == "pkg.mod_factory-my_run_1-s"


# --- Weights & Biases -------------------------------------------------------------------------


def test_without_the_wandb_package_a_warning_says_how_to_install(monkeypatch):
    from llm_marl import TabularPolicy, make
    from llm_marl.learners import MAGRPOTrainer as NativeTrainer
    from llm_marl.learners.config import MAGRPOConfig as NativeConfig

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.warns(UserWarning, match=r"wandb package is not installed: pip install 'llm_marl\[wandb\]'"):
        trainer = NativeTrainer(env=make("ClimbingGame-v0"), policies=[TabularPolicy(["alpha", "beta", "gamma"]) for _ in range(2)],
                                args=NativeConfig(num_turns=1, num_train_epochs=1, report_to="wandb", progress_bar=False))
    assert trainer.wandb is None
    trainer.train()  # still trains, recorded locally


def test_report_to_wandb_sends_the_same_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    sys.path.insert(0, str(Path(__file__).parent))
    from wandb_records import offline_run

    from llm_marl import TabularPolicy, make
    from llm_marl.learners import MAGRPOTrainer as NativeTrainer
    from llm_marl.learners.config import MAGRPOConfig as NativeConfig

    config = NativeConfig(num_turns=1, num_train_epochs=3, report_to=["tensorboard", "wandb"], progress_bar=False,
                          logging_steps=1, eval_interval=2, eval_num_samples=1, output_dir=str(tmp_path / "run"))
    trainer = NativeTrainer(env=make("ClimbingGame-v0"), policies=[TabularPolicy(["alpha", "beta", "gamma"]) for _ in range(2)], args=config)
    trainer.train()
    trainer.evaluate()
    trainer.wandb.finish()
    run = offline_run(str(tmp_path / "run"))  # W&B's dir defaults to the run directory
    assert run["config"]["report_to"] == ["tensorboard", "wandb"] and run["config"]["num_train_epochs"] == 3
    logged: dict[int, dict] = {}
    for row in run["history"]:
        logged.setdefault(row["_step"], {}).update({k: v for k, v in row.items() if not k.startswith("_")})
    expected: dict[int, dict] = {}
    for step, metrics in trainer.logger.history:
        expected.setdefault(step, {}).update(metrics)
    assert logged.keys() == expected.keys() and len(expected) >= 3
    for step in expected:
        assert logged[step] == pytest.approx(expected[step]), step


# --- comlrl.trainers.actor_critic ---------------------------------------------------------------


def test_actor_critic_paths_train_with_comlrl_optimizer_defaults():
    import llm_marl.learners as learners
    from llm_marl import TabularPolicy, make
    from llm_marl.comlrl.trainers import IACTrainer as from_trainers
    from llm_marl.comlrl.trainers.actor_critic import ActorCriticTrainerBase, IACConfig, IACTrainer, MAACConfig, MAACTrainer
    from llm_marl.comlrl.trainers.actor_critic.iac import IACTrainer as from_module

    assert from_trainers is IACTrainer is from_module
    assert issubclass(IACTrainer, learners.IACTrainer) and issubclass(MAACTrainer, learners.MAACTrainer)
    assert issubclass(MAACTrainer, ActorCriticTrainerBase)
    for trainer_class, config_class in ((IACTrainer, IACConfig), (MAACTrainer, MAACConfig)):
        config = config_class(num_turns=1, num_train_epochs=2, agent_learning_rate=0.1, critic_learning_rate=0.1,
                              eval_interval=0, progress_bar=False, agent_devices=["cpu"])
        assert config.weight_decay == 0.01 and config.agent_devices == ["cpu", "cpu"]
        trainer = trainer_class(env=make("ClimbingGame-v0"), policies=[TabularPolicy(["alpha", "beta", "gamma"]) for _ in range(2)],
                                args=config)
        optimizers = trainer.optimizers + list(trainer.critic_optimizers.values())
        assert len(optimizers) >= 3  # two actors and at least one critic
        assert all(group["weight_decay"] == 0.01 for optimizer in optimizers for group in optimizer.param_groups)
        state = trainer.train(checkpoint_total_limit=1)
        assert state.epoch == 2 and state.global_step >= 1


def test_wandb_config_sections_dataset_type_and_name_are_copied_flat_as_comlrl_does():
    from llm_marl.runs.logging import wandb_init_kwargs

    sections = {"dataset": {"type": "tldr", "name": "trl-lib/tldr"}, "trainer": {"num_turns": 1}}
    config = wandb_init_kwargs({"config_sections": sections}, {"num_turns": 1}, None)["config"]
    assert config["dataset_type"] == "tldr" and config["dataset_name"] == "trl-lib/tldr"
    assert config["dataset"] == sections["dataset"] and config["trainer"] == {"num_turns": 1}
    given = wandb_init_kwargs({"config_sections": sections}, {"dataset_type": "arxiv"}, None)["config"]
    assert given["dataset_type"] == "arxiv"  # dataset_type= of the trainer call (1.4.0-1.4.2) wins
