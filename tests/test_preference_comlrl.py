"""CoMLRL's preference import paths (docs/preference.md): scripts in the shape of the companion
repositories' MADPO and MARLHF launchers migrate with the README's one line and train; the
helper modules behave as CoMLRL's.

``tests/comlrl_preference_script/`` holds ``train_madpo.py`` and ``train_marlhf.py`` written
for CoMLRL (``from comlrl...`` imports, ``MADPOConfig`` / ``MARLHFConfig`` fields, the
drop-in keywords, ``configure_job_cuda_cache``, the comparator adapters). The test copies the
folder, runs the sed line taken verbatim from the README, checks that only import lines changed,
then runs each script in this process on a tiny local model.
"""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SCRIPT_DIR = Path(__file__).parent / "comlrl_preference_script"


def readme_sed_line() -> str:
    lines = [line for line in (REPO / "README.md").read_text().splitlines() if "llm_marl.comlrl" in line and "sed -i" in line]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from llm_marl.policies.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", pretrain_steps=0))


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    work = tmp_path_factory.mktemp("companion") / "repo"
    shutil.copytree(SCRIPT_DIR, work)
    before = {p.name: p.read_text().splitlines() for p in work.glob("*.py")}
    subprocess.run(["bash", "-c", readme_sed_line()], cwd=work, check=True)
    after = {p.name: p.read_text().splitlines() for p in work.glob("*.py")}
    return work, before, after


def test_the_sed_line_rewrites_only_the_imports(migrated):
    _, before, after = migrated
    for name in before:
        changed = [(a, b) for a, b in zip(before[name], after[name]) if a != b]
        assert len(before[name]) == len(after[name]) and changed, name
        for old, new in changed:
            assert new == old.replace("from comlrl", "from llm_marl.comlrl"), (name, old, new)


def run_script(work, name, argv, monkeypatch):
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "argv", [name, *argv])
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    runpy.run_path(str(work / name), run_name="__main__")


def metrics_of(work):
    runs = sorted((work / "runs").iterdir())
    import json

    rows = [json.loads(line) for line in (runs[-1] / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {key for row in rows for key in row}


def test_a_comlrl_madpo_script_trains_after_migration(migrated, tiny_model, monkeypatch):
    work, _, _ = migrated
    run_script(work, "train_madpo.py", ["--model", tiny_model, "--save_path", str(work / "madpo_model")], monkeypatch)
    assert (work / "madpo_model" / "agent_0" / "config.json").exists() and (work / "madpo_model" / "agent_1" / "config.json").exists()
    assert {"train/dpo/loss", "train/preference/pairs_per_item", "eval/turn_1/reward_mean"} <= metrics_of(work)


def test_a_comlrl_marlhf_script_trains_after_migration(migrated, tiny_model, monkeypatch):
    work, _, _ = migrated
    run_script(work, "train_marlhf.py", ["--model", tiny_model, "--save_path", str(work / "marlhf_model")], monkeypatch)
    assert (work / "marlhf_model" / "reward_model" / "reward_model.pt").exists()
    assert {"reward_model/loss", "train/reward_model/score_mean", "train/turn_1/reward_mean"} <= metrics_of(work)


# --- the helper modules ---------------------------------------------------------------------


def test_the_import_paths_exist():
    from llm_marl.comlrl.models.actor_critic import CausalLMWithValueHead, ValueHead  # noqa: F401
    from llm_marl.comlrl.runtime import configure_job_cuda_cache  # noqa: F401
    from llm_marl.comlrl.trainers import JointRewardModel, MADPOTrainer, MARLHFTrainer  # noqa: F401
    from llm_marl.comlrl.trainers.magrpo import MAGRPOConfig, MAGRPOTrainer
    from llm_marl.comlrl.trainers.preference import __all__ as names
    from llm_marl.comlrl.trainers.reinforce import MAGRPOTrainer as current

    assert MAGRPOTrainer is current and MAGRPOConfig.__module__.startswith("llm_marl.comlrl")
    assert {"MADPOConfig", "MADPOTrainer", "MARLHFConfig", "MARLHFTrainer", "JointRewardModel",
            "TaggedCentralizedComparatorAdapter", "CentralizedComparatorParseError"} <= set(names)


def test_comlrl_defaults_of_the_preference_configs():
    from llm_marl.comlrl.trainers.preference import MADPOConfig, MARLHFConfig

    madpo = MADPOConfig()
    assert (madpo.preference_num_candidates, madpo.preference_pairs_per_sample, madpo.pair_selection, madpo.dpo_beta) == (80, 16, "reward_gap", 0.1)
    assert madpo.dpo_reference is False and madpo.weight_decay == 0.01 and madpo.num_turns == 1 and madpo.preference_refresh == "once"
    marlhf = MARLHFConfig(rl_algorithm="maremax")
    assert marlhf.advantage_mode == "max" and marlhf.num_generations == 4 and marlhf.reward_num_train_epochs == 1


def test_tagged_adapter_builds_and_parses():
    from llm_marl.comlrl.trainers.preference import CentralizedComparatorParseError, TaggedCentralizedComparatorAdapter

    adapter = TaggedCentralizedComparatorAdapter()
    prompt = adapter.build_prompt({}, ["write a", "write b"])
    assert "Agent 0 original prompt:\nwrite a" in prompt and "<agent_1>\n...\n</agent_1>" in prompt
    assert adapter.parse_completion("< Agent_1 > two </agent_1> <agent_0>one</ AGENT_0 >", {}, 2) == ["one", "two"]
    assert adapter.parse_completion("<agent_0>only</agent_0>", {}, 2) == ["only", ""]
    with pytest.raises(CentralizedComparatorParseError, match="no <agent_i> section"):
        adapter.parse_completion("no tags", {}, 2)


def test_reward_utils_call_forms_and_ranges():
    from llm_marl.comlrl.utils.reward_utils import call_reward_function, normalize_reward_lengths, resolve_reward_range, set_reward_range

    seen = {}

    def with_items(a, b, batch_items=None):
        seen["items"] = batch_items
        return [len(a[0]) + len(b[0])]

    assert call_reward_function(with_items, ["p"], [["ab"], ["c"]], num_agents=2, batch_items=[{"i": 1}]) == [3.0]
    assert seen["items"] == [{"i": 1}]
    assert call_reward_function(lambda prompts, a, b: [len(prompts[0])], ["xyz"], [["a"], ["b"]], num_agents=2) == [3.0]
    assert call_reward_function(lambda lists: [len(lists)], ["p"], [["a"], ["b"]], num_agents=2) == [2.0]
    assert call_reward_function(lambda *c, **kw: torch.tensor([0.5]), ["p"], [["a"], ["b"]], num_agents=2) == [0.5]
    assert normalize_reward_lengths([2.0], num_agents=3, num_generations=4, algorithm="MAGRPO") == [2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="returned 2 values"):
        normalize_reward_lengths([1.0, 2.0], num_agents=3, num_generations=4, algorithm="MAGRPO")
    fn = set_reward_range(lambda *a: [0.0], -1, 4)
    assert resolve_reward_range(fn) == (-1.0, 4.0) and resolve_reward_range(lambda: 0) is None
    with pytest.raises(ValueError, match="minimum 4.0 must be less"):
        set_reward_range(lambda: 0, 4, 4)


class _NoSignatureReward:
    """A reward callable whose signature cannot be read; it takes only the list of lists."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    @property
    def __signature__(self):
        raise ValueError("no signature")

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if kwargs or len(args) != 1:
            raise TypeError("takes one list of lists")
        return [len(args[0])]


def test_reward_call_without_a_signature_tries_each_form_in_turn():
    from llm_marl.comlrl.utils.reward_utils import call_reward_function

    reward = _NoSignatureReward()
    completions, items = [["a"], ["b"]], [{"i": 1}]
    assert call_reward_function(reward, ["p"], completions, num_agents=2, batch_items=items) == [2.0]
    assert reward.calls == [((["a"], ["b"]), {"batch_items": items}), ((["a"], ["b"]), {}), ((completions,), {})]
    three = _NoSignatureReward()  # f(["a"], ["b"], ["c"]) refused: the list-of-lists call is the third form
    assert call_reward_function(three, ["p"], [["a"], ["b"], ["c"]], num_agents=3) == [3.0] and len(three.calls) == 2
    refusing = _NoSignatureReward()  # one agent, and the function wants keywords it is never given: the last TypeError stands
    with pytest.raises(TypeError, match="takes one list of lists"):
        call_reward_function(refusing, ["p"], [["a"], ["b"]], num_agents=1)


def test_formatters_pass_external_prompts_only_where_taken():
    from llm_marl.comlrl.utils.formatters import build_formatters

    plain, default = build_formatters(lambda item: item["q"], 2), build_formatters(None, 1)[0]
    assert [f({"q": "x"}, external_prompts="ignored") for f in plain] == ["x", "x"]
    assert default({"prompt": "p"}) == "p" and default({"prompt": "p"}, external_prompts="e") == "e"
    seen = []
    strict = build_formatters(lambda item, external_prompts="unset": seen.append(external_prompts) or "", 1, pass_none_external_prompts=False)[0]
    strict({}), strict({}, external_prompts="t")
    assert seen == ["unset", "t"]
    with pytest.raises(ValueError, match="1 formatters for 2 agents"):
        build_formatters([lambda item: ""], 2)


def test_value_head_and_causal_lm_wrapper(tiny_model):
    from transformers import AutoModelForCausalLM

    from llm_marl.comlrl.models.actor_critic import CausalLMWithValueHead, ValueHead

    head = ValueHead(8, hidden_dim=4)
    assert head(torch.zeros(3, 8)).shape == (3, 1) and torch.equal(head.value_projection.bias, torch.zeros(1))
    model = CausalLMWithValueHead(AutoModelForCausalLM.from_pretrained(tiny_model))
    out = model(torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long))
    assert out.values.shape == (1, 3) and out.logits.shape[:2] == (1, 3)
    assert CausalLMWithValueHead(model.model, attach_value_head=False)(torch.tensor([[1, 2]])).values is None


def test_configure_job_cuda_cache(monkeypatch, tmp_path):
    from llm_marl.comlrl.runtime import configure_job_cuda_cache

    for name in ("SLURM_JOB_ID", "SLURM_JOBID", "CUDA_CACHE_PATH", "CUDA_CACHE_DISABLE", "COMLRL_CUDA_CACHE_ROOT"):
        monkeypatch.delenv(name, raising=False)
    assert configure_job_cuda_cache() is None  # not a Slurm job
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    monkeypatch.setenv("COMLRL_CUDA_CACHE_ROOT", str(tmp_path))
    path = configure_job_cuda_cache()
    assert Path(path).parent == tmp_path and Path(path).name.startswith("comlrl-cuda-123-") and os.environ["CUDA_CACHE_PATH"] == path
    assert oct(Path(path).stat().st_mode & 0o777) == "0o700"
    assert configure_job_cuda_cache() == path  # kept once set
    monkeypatch.delenv("CUDA_CACHE_PATH")
    monkeypatch.setenv("SLURM_JOB_ID", "../x")
    with pytest.raises(ValueError, match="SLURM_JOB_ID"):
        configure_job_cuda_cache()


def test_centralized_magrpo_with_comlrl_keywords_splits_the_joint_answer_for_the_reward(tiny_model, tmp_path):
    from datasets import Dataset

    from llm_marl.comlrl.trainers.preference import TaggedCentralizedComparatorAdapter
    from llm_marl.comlrl.trainers.reinforce.centralized_magrpo import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer

    calls = []

    def reward(first, second, batch_items=None):
        calls.append((list(first), list(second), batch_items[0]["topic"]))
        return [float(len(first[0]) + len(second[0]))]

    args = CentralizedMAGRPOConfig(num_agents=2, num_train_epochs=1, num_generations=2, max_new_tokens=4, temperature=1.0, top_p=1.0,
                                   top_k=None, rollout_buffer_size=1, eval_interval=0, output_dir=str(tmp_path / "run"), progress_bar=False)
    trainer = CentralizedMAGRPOTrainer(
        centralized_adapter=TaggedCentralizedComparatorAdapter(), num_agents=2, agent_model=tiny_model, reward_func=reward,
        formatters=[lambda item: f"first {item['topic']}", lambda item: f"second {item['topic']}"],
        train_dataset=Dataset.from_list([{"topic": "module"}, {"topic": "import"}]), args=args,
    )
    assert trainer.agent_ids == ["actor"] and len(trainer.agents) == trainer.num_agents == 1 and trainer.role_args.num_agents == 2 and args.weight_decay == 0.01
    observations, _ = trainer.env.reset(options={"index": 0})
    assert "Agent 0 original prompt:\nfirst module" in observations["actor"] and "Agent 1 original prompt:\nsecond module" in observations["actor"]
    trainer.train()
    assert trainer.state.global_step == 2 and len(calls) == 4
    assert all(len(first) == len(second) == 1 for first, second, _ in calls)  # one answer per role per call
    with pytest.raises(ValueError, match="exactly one actor model; agents= lists 2"):
        CentralizedMAGRPOTrainer(centralized_adapter=TaggedCentralizedComparatorAdapter(), agents=[tiny_model, tiny_model], reward_func=reward,
                                 train_dataset=Dataset.from_list([{"topic": "x"}]), args=args)


def test_iterative_configs_have_comlrl_defaults():
    from llm_marl.comlrl.trainers.preference import MADPOIterConfig, MARLHFIterConfig

    madpo = MADPOIterConfig()
    assert (madpo.num_iterations, madpo.num_train_epochs, madpo.preference_num_candidates, madpo.preference_pairs_per_sample) == (6, 1, 20, 4)
    assert madpo.pair_selection == "comparator_reward" and madpo.preference_replay_mode == "current" and madpo.dpo_reference is False
    marlhf = MARLHFIterConfig()
    assert (marlhf.num_train_epochs, marlhf.reward_num_train_epochs, marlhf.preference_scoring_reward) == (2, 2, "task")


def test_centralized_madpo_and_marlhf_from_comlrl_keywords(tiny_model, tmp_path):
    from datasets import Dataset

    from llm_marl.comlrl.trainers.preference import MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer, TaggedCentralizedComparatorAdapter

    def reward(first, second, batch_items=None):
        return [float(len(set(first[0])) - len(second[0]))]

    class Halves(TaggedCentralizedComparatorAdapter):
        """A custom adapter: the first half of the joint answer is role 0's, the rest role 1's."""

        def parse_completion(self, completion, batch_item, num_agents):
            return [completion[: len(completion) // 2], completion[len(completion) // 2 :]]

    common = dict(num_agents=2, num_train_epochs=1, max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, rollout_buffer_size=2,
                  preference_num_candidates=3, preference_pairs_per_sample=2, eval_interval=0, progress_bar=False, collaboration_mode="centralized")
    keywords = dict(agent_model=tiny_model, num_agents=2, reward_func=reward, train_dataset=Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}]),
                    formatters=[lambda item: f"first {item['prompt']}", lambda item: f"second {item['prompt']}"],
                    centralized_comparator_adapter=Halves())
    madpo = MADPOTrainer(args=MADPOConfig(**common, output_dir=str(tmp_path / "madpo")), **keywords)
    assert madpo.agent_ids == ["actor"] and madpo.roles == ["agent_0", "agent_1"]
    madpo.train()
    marlhf = MARLHFTrainer(args=MARLHFConfig(**common, num_generations=2, reward_learning_rate=1e-3, output_dir=str(tmp_path / "marlhf")), **keywords)
    marlhf.train()
    assert marlhf.agent_ids == ["actor"] and marlhf.reward_phase.done


def test_centralized_marlhf_with_an_actor_critic_rl_phase_from_comlrl_keywords(tiny_model, tmp_path):
    """rl_algorithm "iac": one generation per item is accepted (as IACConfig, and CoMLRL), and CoMLRL's
    centralized keywords (agent_model= for the one actor, num_agents=2 roles) build the team."""
    from datasets import Dataset

    from llm_marl.comlrl.trainers.preference import MARLHFConfig, MARLHFTrainer

    with pytest.raises(ValueError, match="num_generations must be an int >= 2"):
        MARLHFConfig(num_generations=1)  # the MAGRPO family's group baseline needs two
    args = MARLHFConfig(num_agents=2, num_train_epochs=1, max_new_tokens=4, rollout_buffer_size=2, preference_num_candidates=2,
                        eval_interval=0, progress_bar=False, collaboration_mode="centralized", rl_algorithm="iac", num_generations=1,
                        output_dir=str(tmp_path / "run"))
    trainer = MARLHFTrainer(args=args, agent_model=tiny_model, num_agents=2, reward_func=lambda a, b: [1.0] * len(a),
                            train_dataset=Dataset.from_list([{"prompt": "a"}]),
                            formatters=[lambda item: "first", lambda item: "second"])
    assert trainer.agent_ids == ["actor"] and trainer.roles == ["agent_0", "agent_1"] and trainer.args.num_generations == 1
