"""Programs as environments (issue 45): ProgramEnv runs a program written with the real
``openai`` client against the real local endpoint.

The team is a writer and an editor: the writer answers "Write about <topic>.", the editor is
asked to edit the writer's reply, and the program scores the editor's reply. The same team as a
hand-written turn-based CooperativeTask gives the same rollout trees and the same weights after
two MAGRPO steps.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import threading
import warnings

import datasets
import psutil
import pytest
import torch

pytest.importorskip("openai")
torch.set_num_threads(1)

from pettingzoo.test import parallel_api_test  # noqa: E402

from llm_marl.envs import DialogueEnv, ProgramEnv  # noqa: E402
from llm_marl.learners import IACConfig, IACTrainer, MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from llm_marl.learners.tree import collect_trees  # noqa: E402
from llm_marl.policies.causal_lm import CausalLMPolicy  # noqa: E402
from llm_marl.policies.scripted import ScriptedPolicy  # noqa: E402
from llm_marl.programs import ProgramDivergenceError, ProgramError, ProgramWarning  # noqa: E402
from llm_marl.tasks.base import CooperativeTask  # noqa: E402
from tiny_chat_model import chat_tokenizer, tiny_llama  # noqa: E402

ITEMS = [{"topic": "the sea"}, {"topic": "a ship"}]


def score(draft: str, edited: str) -> float:
    return float(len(edited.split()) + (len(draft) % 3))


def team(item, client):
    draft = client.chat.completions.create(model="writer", messages=[{"role": "user", "content": f"Write about {item['topic']}."}]).choices[0].message.content
    edited = client.chat.completions.create(model="editor", messages=[{"role": "user", "content": f"Edit: {draft}"}]).choices[0].message.content
    return score(draft, edited), {"draft": draft}


class Team(CooperativeTask):
    """The same team, hand-written."""

    agents = ("writer", "editor")
    num_turns = 2

    def dataset(self, split):
        return datasets.Dataset.from_list(ITEMS)

    def acting_agents(self, item, history):
        return ("writer",) if not history else ("editor",)

    def initial_observations(self, item):
        return {"writer": f"Write about {item['topic']}.", "editor": ""}

    def transition(self, item, actions, history):
        return {"writer": "", "editor": f"Edit: {actions['writer']}"}

    def reward(self, item, actions, history):
        if not history:
            return 0.0
        return score(history[0].actions["writer"], actions["editor"])


@pytest.fixture(scope="module")
def chat_model():
    tokenizer = chat_tokenizer()
    return tiny_llama(tokenizer), tokenizer


def lm_policies(chat_model):
    model, tokenizer = chat_model
    return {a: CausalLMPolicy(copy.deepcopy(model), tokenizer, max_new_tokens=4, temperature=1.0, top_p=None, top_k=None) for a in ("writer", "editor")}


def open_sockets() -> set:
    """This process's open inet sockets (by their addresses)."""
    return {(c.fd, c.laddr, c.raddr) for c in psutil.Process().net_connections(kind="inet")}


def tree_summary(node, policies):
    """Everything a learner reads from a tree: rendered prompts, sampled token ids, rewards,
    returns, and the same of the children."""
    return (
        node.turn, node.index,
        {a: policies[a].render_prompt(node.observations[a]) for a in node.agents},
        {a: [list(c.token_ids) for c in node.completions[a]] for a in node.agents},
        list(node.joint), node.rewards, node.returns,
        [None if child is None else tree_summary(child, policies) for child in node.children],
    )


def test_a_programs_trees_and_weights_after_two_magrpo_steps_equal_the_hand_written_tasks(chat_model):
    args = dict(num_turns=2, num_generations=2, num_train_epochs=1, items_per_step=1, rollout_buffer_size=1, max_steps=2,
                agent_learning_rate=1e-2, eval_interval=0, progress_bar=False, seed=0, early_termination_threshold=None)
    program_env = ProgramEnv(team, ("writer", "editor"), datasets.Dataset.from_list(ITEMS), num_turns=2)
    policies = lm_policies(chat_model)
    torch.manual_seed(1)
    program_trees = collect_trees(program_env, policies, [0, 1], MAGRPOConfig(**args))
    torch.manual_seed(1)
    task_trees = collect_trees(DialogueEnv(Team()), policies, [0, 1], MAGRPOConfig(**args))
    assert [tree_summary(t, policies) for t in program_trees] == [tree_summary(t, policies) for t in task_trees]
    root = program_trees[0]
    assert root.agents == ["writer"] and [c.agents for c in root.children] == [["editor"], ["editor"]]  # K = 2 branches, each replayed
    assert root.children[0].observations["editor"] == [{"role": "user", "content": f"Edit: {root.completions['writer'][0].text}"}]
    assert any(r != 0 for child in root.children for r in child.rewards)

    assert_same_weights_after_two_steps(chat_model, program_env, MAGRPOConfig, MAGRPOTrainer, args)
    program_env.close()


def assert_same_weights_after_two_steps(chat_model, program_env, config_class, trainer_class, args):
    trained = {}
    for name, env in (("program", program_env), ("task", DialogueEnv(Team()))):
        team_policies = lm_policies(chat_model)
        trainer = trainer_class(env=env, policies=team_policies, args=config_class(**args))
        trainer.train()
        assert trainer.state.global_step == 2
        trained[name] = {a: [p.detach().clone() for p in trainer.policies[a].model.parameters()] for a in team_policies}
        critics = getattr(trainer, "critics", None) or {}
        trained[name].update({f"critic {a}": [p.detach().clone() for p in c.parameters()] for a, c in critics.items()})
    start = lm_policies(chat_model)
    assert set(trained["program"]) == set(trained["task"])
    for key in trained["program"]:
        assert all(torch.equal(p, q) for p, q in zip(trained["program"][key], trained["task"][key])), key
    for agent in ("writer", "editor"):
        assert not all(torch.equal(p, q) for p, q in zip(trained["program"][agent], start[agent].model.parameters()))  # it trained


def test_iac_on_a_program_equals_iac_on_the_hand_written_task_whose_critics_read_every_agent(chat_model):
    """IAC's critics value every agent's observation at every node, the non-acting agent's too
    (a program gives it the empty prompt, as the task does)."""
    args = dict(num_turns=2, num_generations=2, num_train_epochs=1, items_per_step=1, rollout_buffer_size=1, max_steps=2,
                agent_learning_rate=1e-2, eval_interval=0, progress_bar=False, seed=0, early_termination_threshold=None)
    program_env = ProgramEnv(team, ("writer", "editor"), datasets.Dataset.from_list(ITEMS), num_turns=2)
    assert_same_weights_after_two_steps(chat_model, program_env, IACConfig, IACTrainer, args)
    program_env.close()


def test_calls_gathered_by_an_async_program_are_one_step_and_a_second_call_of_an_agent_waits():
    async def program(item, client):
        def ask(agent, text):
            return client.chat.completions.create(model=agent, messages=[{"role": "user", "content": text}])
        first, second, again = await asyncio.gather(ask("writer", "w1"), ask("editor", "e1"), ask("editor", "e2"))
        last = await ask("writer", first.choices[0].message.content + second.choices[0].message.content + again.choices[0].message.content)
        return float(len(last.choices[0].message.content))

    env = ProgramEnv(program, ("writer", "editor"), [{}])
    observations, infos = env.reset(options={"index": 0})
    assert env.acting_agents == ["writer", "editor"] and infos["writer"]["acting_agents"] == ["writer", "editor"]
    assert observations == {"writer": [{"role": "user", "content": "w1"}], "editor": [{"role": "user", "content": "e1"}]}
    observations, rewards, terminations, *_ = env.step({"writer": "A", "editor": "B"})
    assert env.acting_agents == ["editor"] and observations["editor"] == [{"role": "user", "content": "e2"}] and observations["writer"] == ""
    assert rewards == {"writer": 0.0, "editor": 0.0} and terminations == {"writer": False, "editor": False}
    observations, *_ = env.step({"editor": "C", "writer": "ignored: not acting"})
    assert observations["writer"] == [{"role": "user", "content": "ABC"}]
    _, rewards, terminations, _, infos = env.step({"writer": "four"})
    assert rewards == {"writer": 4.0, "editor": 4.0} and terminations == {"writer": True, "editor": True} and env.agents == []
    env.close()


def test_an_async_program_working_between_two_calls_is_waited_for_until_its_loop_is_idle():
    """The writer's call is held while the program still runs (a loop never idle) before it calls
    the editor: both calls are one step, however long the work takes."""
    async def program(item, client):
        writer = asyncio.ensure_future(client.chat.completions.create(model="writer", messages=[{"role": "user", "content": "w"}]))
        for _ in range(3000):
            await asyncio.sleep(0)  # work between the calls, yielding to the loop
        editor = await client.chat.completions.create(model="editor", messages=[{"role": "user", "content": "e"}])
        return float(len((await writer).choices[0].message.content + editor.choices[0].message.content))

    env = ProgramEnv(program, ("writer", "editor"), [{}])
    env.reset(options={"index": 0})
    assert env.acting_agents == ["writer", "editor"]
    _, rewards, *_ = env.step({"writer": "ab", "editor": "c"})
    assert rewards == {"writer": 3.0, "editor": 3.0}
    env.close()


def test_forks_replay_the_recorded_replies_and_branch_k_ways():
    runs = []

    def program(item, client):
        runs.append(item["n"])
        draft = client.chat.completions.create(model="writer", messages=[{"role": "user", "content": "go"}]).choices[0].message.content
        final = client.chat.completions.create(model="editor", messages=[{"role": "system", "content": "edit"}, {"role": "user", "content": draft}])
        return float(len(final.choices[0].message.content)), {"draft": draft}

    env = ProgramEnv(program, ("writer", "editor"), [{"n": 0}])
    env.reset(options={"index": 0})
    branches = env.step_branches([{"writer": w} for w in ("a", "bb", "ccc")])
    assert [b.observations["editor"][1]["content"] for b in branches] == ["a", "bb", "ccc"]
    assert len(runs) == 3  # the running program went to the first branch; the other two replayed
    ends = [b.env.step_branches([{"editor": "xy"}, {"editor": "xyz"}]) for b in branches]
    assert [[end.rewards["writer"] for end in pair] for pair in ends] == [[2.0, 3.0]] * 3
    assert [pair[1].infos["editor"]["reward_details"] for pair in ends] == [{"draft": "a"}, {"draft": "bb"}, {"draft": "ccc"}]
    assert len(runs) == 3 + 3  # each branch's second joint action replayed its branch

    policies = {"writer": ScriptedPolicy(lambda o, k: [f"w{i}" for i in range(k)]), "editor": ScriptedPolicy(lambda o, k: ["e" * (i + 1) for i in range(k)])}
    [root] = collect_trees(env, policies, [0], MAGRPOConfig(num_turns=2, num_generations=3, early_termination_threshold=None))
    assert [child.observations["editor"][1]["content"] for child in root.children] == ["w0", "w1", "w2"]
    assert [child.rewards for child in root.children] == [[1.0, 2.0, 3.0]] * 3
    env.close()


def test_a_replayed_call_whose_messages_differ_stops_the_run_naming_the_call_and_message():
    calls = []

    def program(item, client):
        calls.append(1)
        client.chat.completions.create(model="writer", messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": f"attempt {len(calls)}"}])
        client.chat.completions.create(model="editor", messages=[{"role": "user", "content": "edit"}])
        return 1.0

    env = ProgramEnv(program, ("writer", "editor"), [{}])
    env.reset(options={"index": 0})
    with pytest.raises(ProgramDivergenceError) as caught:
        env.fork().step({"writer": "x"})
    message = str(caught.value)
    assert "\n" not in message
    assert "item 0, step 0" in message and "agent 'writer'" in message and "message 1 (content): recorded 'attempt 1', now 'attempt 2'" in message
    env.close()


def test_completion_calls_streamed_calls_and_the_models_list_work_through_the_openai_client():
    seen = {}

    def program(item, client):
        seen["models"] = [m.id for m in client.models.list()]
        text = client.completions.create(model="writer", prompt="Once upon").choices[0].text
        stream = client.chat.completions.create(model="editor", messages=[{"role": "user", "content": text}], stream=True)
        edited = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        return float(len(edited))

    env = ProgramEnv(program, ("writer", "editor"), [{}])
    observations, _ = env.reset(options={"index": 0})
    assert seen["models"] == ["writer", "editor"] and observations["writer"] == "Once upon"  # a completion's prompt
    observations, *_ = env.step({"writer": " a time"})
    assert observations["editor"] == [{"role": "user", "content": " a time"}]
    _, rewards, *_ = env.step({"editor": "four"})
    assert rewards["editor"] == 4.0
    env.close()


def test_a_call_with_n_above_1_is_refused_with_openais_error_and_fails_the_rollout():
    caught = {}

    def program(item, client):
        client.chat.completions.create(model="writer", messages=[{"role": "user", "content": "go"}])
        try:
            client.chat.completions.create(model="editor", messages=[{"role": "user", "content": "x"}], n=2)
        except Exception as exc:  # the openai client's own error, as from any server
            caught["error"] = exc
            raise

    env = ProgramEnv(program, ("writer", "editor"), [{}])
    env.reset(options={"index": 0})
    with pytest.raises(ProgramError, match=r"a call was refused \(400\): n must be 1 while training"):
        env.step({"writer": "x"})
    assert type(caught["error"]).__name__ == "BadRequestError" and caught["error"].status_code == 400
    env.close()


def raises_at_the_editor(item, client):
    client.chat.completions.create(model="writer", messages=[{"role": "user", "content": "go"}])
    raise ValueError("the editor is out")


def test_a_program_that_raises_stops_the_run_or_scores_zero_or_the_penalty_as_asked():
    env = ProgramEnv(raises_at_the_editor, ("writer", "editor"), [{}], name="team")
    env.reset(options={"index": 0})
    with pytest.raises(ProgramError, match=r"^program team, item 0, step 0: the program failed: ValueError: the editor is out$"):
        env.step({"writer": "x"})
    assert env.agents == ["writer", "editor"] and env.steps == ()  # left as before the step
    for mode, reward in (("zero", 0.0), ("penalty", -2.0)):
        env = ProgramEnv(raises_at_the_editor, ("writer", "editor"), [{}], on_program_error=mode, error_penalty=-2.0)
        env.reset(options={"index": 0})
        with pytest.warns(ProgramWarning, match="ValueError: the editor is out"):
            _, rewards, terminations, _, infos = env.step({"writer": "x"})
        assert rewards == {"writer": reward, "editor": reward} and all(terminations.values())
        assert "ValueError: the editor is out" in infos["writer"]["reward_details"]["program_error"]
        env.close()


def test_unknown_models_hangs_and_bad_returns_fail_the_rollout_and_leave_no_thread_or_socket():
    def unknown(item, client):
        client.chat.completions.create(model="writer", messages=[{"role": "user", "content": "go"}])
        try:
            client.chat.completions.create(model="critic", messages=[{"role": "user", "content": "judge"}])
        except Exception:
            pass  # swallowed by the program: the rollout still fails
        return 1.0

    async def hangs(item, client):
        await client.chat.completions.create(model="writer", messages=[{"role": "user", "content": "go"}])
        await asyncio.sleep(60)
        return 1.0

    def no_number(item, client):
        client.chat.completions.create(model="writer", messages=[{"role": "user", "content": "go"}])
        return "good"

    threads, sockets = set(threading.enumerate()), open_sockets()  # (other tests' threads may end meanwhile)
    cases = [(unknown, r"the program failed: a call was refused \(404\): The model `critic` does not exist. This server has: writer, editor."),
             (hangs, r"did not reach its next call or return within timeout_s=0.5 s"),
             (no_number, r"returned 'good', not a finite number")]
    for program, expected in cases:
        env = ProgramEnv(program, ("writer", "editor"), [{}], timeout_s=0.5)
        env.reset(options={"index": 0})
        with pytest.raises(ProgramError, match=expected):
            env.step({"writer": "x"})
        env.close()
    # and forks dropped mid-episode, their programs blocked on a call: cancelled when collected
    env = ProgramEnv(team, ("writer", "editor"), ITEMS)
    env.reset(options={"index": 0})
    branches = env.step_branches([{"writer": "a"}, {"writer": "b"}])
    assert all(b.env._run is not None and b.env._run.alive for b in branches)
    del branches
    gc.collect()
    env.close()
    assert set(threading.enumerate()) - threads == set() and open_sockets() - sockets == set()


def test_program_env_passes_the_pettingzoo_parallel_api_test():
    env = ProgramEnv(team, ("writer", "editor"), ITEMS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "live agent was not given an observation" and the like
        parallel_api_test(env, num_cycles=10)
    env.close()


def scored_by_item(item, client):
    draft = client.chat.completions.create(model="writer", messages=[{"role": "user", "content": "go"}]).choices[0].message.content
    client.chat.completions.create(model="editor", messages=[{"role": "user", "content": draft}])
    return float(item["n"])


def test_a_program_env_with_eval_items_is_evaluated_on_them_without_an_eval_env(tmp_path):
    policies = {a: ScriptedPolicy(lambda o, k: ["x"] * k) for a in ("writer", "editor")}
    args = MAGRPOConfig(num_turns=2, num_generations=2, eval_num_samples=2, progress_bar=False, output_dir=str(tmp_path))
    env = ProgramEnv(scored_by_item, ("writer", "editor"), [{"n": 1}, {"n": 1}], num_turns=2, eval_items=[{"n": 10}, {"n": 20}])
    trainer = MAGRPOTrainer(env=env, policies=policies, args=args)  # no eval_env: the env's eval_items
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "evaluation skipped"
        assert trainer.evaluate()["eval/turn_2/expected_return"] == 15.0  # (10 + 20) / 2, not the training items' 1
    trainer.eval_env.close()
    env.close()
    with pytest.raises(ValueError, match="program scored_by_item: eval_items must be None or a non-empty list"):
        ProgramEnv(scored_by_item, ("writer", "editor"), [{"n": 1}], eval_items=[])

