"""ProgramEnv: the agents of a multi-agent program as a PettingZoo parallel environment.

``ProgramEnv(program, agents, items)`` where ``program(item, client) -> float | (float, details)``
is a plain function or an ``async def`` one, ``client`` an ``openai`` client (``AsyncOpenAI`` for
an async program) on a local OpenAI-compatible endpoint (:mod:`llm_marl.programs.endpoint`).

=====================  ====================================================================
Agents                 ``agents``: the ``model`` names the program calls
Acting agents          those with a call held at this step (:attr:`ProgramEnv.acting_agents`,
                       and every info's ``"acting_agents"``); the others answer nothing
Observation space      :class:`~llm_marl.programs.messages.Messages`: a call's messages
                       (``[{"role", "content"}, ...]``), a completion call's prompt, ``""``
                       for an agent not calling (and after the end), as tasks give
Action space           :class:`~llm_marl.envs.spaces.Utterance`: the reply (any string)
Step                   every call pending together (:mod:`llm_marl.programs.run`) is one step;
                       ``step(actions)`` answers them and waits for the next step or the end
Rewards                0 until the program returns; then its number, shared by every agent
                       (its ``details`` dict, where it returns one, in ``reward_details``)
Episode                until the program returns; calls after ``num_turns`` steps are an error
=====================  ====================================================================

``eval_items`` (optional, like ``items``) are held-out items: :meth:`ProgramEnv.eval_split` is
the env on them, and a learner given no ``eval_env`` evaluates there.

``reset(seed=None, options=None)`` picks an item (``options={"index": i}``, else drawn with the
env's seeded RNG) and runs the program up to its first step.

**Forks by prefix replay.** A running program cannot be copied, so ``fork()`` returns an env
holding the same recorded steps (each agent's observation and reply) and no program; when a
fork is stepped it runs the program again, answering each recorded call with its recorded reply
(waiting for each step as above), and then answers the new call with the new action. The program
must therefore be deterministic given its replies. A replayed step whose calls differ from the
recorded ones (another set of agents, or other messages) raises
:class:`~llm_marl.programs.errors.ProgramDivergenceError`, one line naming the item, the step,
the agent and the first differing message. ``step_branches`` hands the running program to the
first branch and replays the others.

**Failures.** A program that raises, does not reach its next call or return within ``timeout_s``
seconds, makes a call the endpoint refuses (an unknown model, a bad parameter), returns no
finite number, or calls after ``num_turns`` steps fails the rollout. ``on_program_error``
decides what follows:

- ``"raise"`` (default): :class:`~llm_marl.programs.errors.ProgramError` (a
  :class:`~llm_marl.tasks.base.TaskError`) naming the program, item and step. A learner stops,
  unless its ``reward_error_policy`` is ``"skip"``: then the item's tree is dropped and the error
  shown, as for a task whose reward fails;
- ``"zero"``: the episode ends here with reward 0; ``"penalty"``: with reward ``error_penalty``.
  Either way the error is shown (a :class:`ProgramWarning`) and kept in
  ``infos[agent]["reward_details"]["program_error"]``.

A failure before the program's first call always raises (there is no step to score). The failed
program is cancelled: no thread or socket is left behind. ``close()`` ends the running program
and stops the endpoint; a dropped env's program is cancelled when it is garbage-collected.
"""

from __future__ import annotations

import copy
import math
import warnings
import weakref
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from llm_marl.envs.dialogue import Branch, check_joint_action
from llm_marl.envs.spaces import Utterance
from llm_marl.programs.endpoint import Endpoint
from llm_marl.programs.errors import ProgramDivergenceError, ProgramError
from llm_marl.programs.messages import Messages, first_difference
from llm_marl.programs.run import ProgramRun

ON_PROGRAM_ERROR = ("raise", "zero", "penalty")
NO_CALL = ""
"""The observation of an agent with no call at a step: the empty prompt, which every policy
renders (learners that read every agent's observation, such as IAC's critics, read it too)."""


class ProgramWarning(UserWarning):
    """A program's rollout failed and the env went on (``on_program_error`` "zero"/"penalty")."""


ProgramBranch = Branch
"""One stepped fork: the forked env and what its ``step`` returned (the same record as
:class:`~llm_marl.envs.dialogue.Branch`)."""


class _Outcome(NamedTuple):
    kind: str  # "calls", "done" or "failed"
    calls: dict[str, Any]
    reward: float
    details: dict[str, Any]
    error: str | None


class ProgramEnv(ParallelEnv):
    """A program calling one model per agent, played through PettingZoo's parallel API."""

    metadata = {"name": "program_v0", "render_modes": ["ansi"], "render_fps": 1, "is_parallelizable": True}

    def __init__(
        self,
        program: Callable[..., Any],
        agents: Sequence[str],
        items: Any,
        *,
        num_turns: int = 8,
        timeout_s: float = 60.0,
        on_program_error: str = "raise",
        error_penalty: float = -1.0,
        name: str | None = None,
        render_mode: str | None = None,
        eval_items: Any = None,
    ):
        if not callable(program):
            raise TypeError(f"program must be a callable program(item, client), got {program!r}")
        self.name = name or getattr(program, "__name__", type(program).__name__)
        agents = list(agents) if not isinstance(agents, str) else []
        if not agents or len(set(agents)) != len(agents) or not all(isinstance(a, str) and a for a in agents):
            raise ValueError(f"program {self.name}: agents must be distinct non-empty strings (the models it calls), got {agents!r}")
        if items is None or len(items) == 0:
            raise ValueError(f"program {self.name}: items must be a non-empty list of dicts or a datasets.Dataset")
        if isinstance(num_turns, bool) or not isinstance(num_turns, int) or num_turns < 1:
            raise ValueError(f"program {self.name}: num_turns must be an int >= 1 (the most steps of calls), got {num_turns!r}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"program {self.name}: timeout_s must be a number > 0, got {timeout_s!r}")
        if on_program_error not in ON_PROGRAM_ERROR:
            raise ValueError(f"program {self.name}: on_program_error must be one of {', '.join(ON_PROGRAM_ERROR)}, got {on_program_error!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        if eval_items is not None and len(eval_items) == 0:
            raise ValueError(f"program {self.name}: eval_items must be None or a non-empty list of dicts or a datasets.Dataset")
        self.program = program
        self.data = items
        self.eval_items = eval_items
        self.num_turns = num_turns
        self.timeout_s = float(timeout_s)
        self.on_program_error = on_program_error
        self.error_penalty = float(error_penalty)
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "name": f"{self.name}_v0"}
        self.possible_agents = list(agents)
        self.agents: list[str] = []
        self._observation_spaces = {a: Messages() for a in self.possible_agents}
        self._action_spaces = {a: Utterance(1_000_000) for a in self.possible_agents}
        self._np_random, self._np_random_seed = seeding.np_random(None)
        self._endpoint = Endpoint()
        self.item_index: int | None = None
        self.item: Any = None
        self.steps: tuple[dict[str, tuple[Any, str]], ...] = ()
        self._observations: dict[str, Any] = {}
        self._acting: tuple[str, ...] = ()
        self._run: ProgramRun | None = None
        self._finalizer: weakref.finalize | None = None

    # --- PettingZoo API -------------------------------------------------------------------------

    def observation_space(self, agent: str) -> Messages:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> Utterance:
        return self._action_spaces[agent]

    @property
    def acting_agents(self) -> list[str]:
        """The agents with a call at this step (in agent order); [] once the episode has ended."""
        return list(self._acting) if self.agents else []

    @property
    def turn(self) -> int:
        """The 0-based index of the step about to be played."""
        return len(self.steps)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        index = (options or {}).get("index")
        if index is not None and (isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.data)):
            raise ValueError(f"options['index'] must be an int in [0, {len(self.data)}), got {index!r}")
        if seed is not None:
            self._np_random, self._np_random_seed = seeding.np_random(seed)
        if index is None:
            rng = copy.deepcopy(self._np_random)  # forks share the generator: never draw in place
            index = int(rng.integers(len(self.data)))
            self._np_random = rng
        self._release()
        self.item_index, self.item, self.steps = int(index), self.data[int(index)], ()
        self.agents = []
        self._start()
        outcome = self._outcome()
        if outcome.kind != "calls":
            self._release()
            what = f"failed: {outcome.error}" if outcome.kind == "failed" else "returned without calling any agent"
            raise ProgramError(f"{self._where()}: the program {what}")
        self._observations, self._acting = self._observe(outcome.calls), tuple(outcome.calls)
        self.agents = list(self.possible_agents)
        return dict(self._observations), self._infos(0, {})

    def step(self, actions: Mapping[str, str]):
        self._check_actions(actions)
        replies = {a: actions[a] for a in self._acting}
        if self._run is None or self._run.cancelled:  # a fork, or a run its endpoint's close() ended
            self._start()
            self._replay()
        record = {a: (self._observations[a], replies[a]) for a in self._acting}
        played = len(self.steps)
        self._run.answer(replies)
        self.steps = self.steps + (record,)
        outcome = self._outcome()
        if outcome.kind == "calls" and len(self.steps) >= self.num_turns:
            self._release()
            outcome = _Outcome("failed", {}, 0.0, {}, f"it made calls after num_turns={self.num_turns} steps (agents {list(outcome.calls)}); build the env with a larger num_turns")
        if outcome.kind == "failed":
            message = f"{self._where(played)}: the program failed: {outcome.error}"
            if self.on_program_error == "raise":
                self.steps = self.steps[:-1]  # the env stays as it was before this step
                raise ProgramError(message)
            warnings.warn(message, ProgramWarning, stacklevel=2)
            reward = 0.0 if self.on_program_error == "zero" else self.error_penalty
            return self._end(reward, {"program_error": message}, played)
        if outcome.kind == "done":
            return self._end(outcome.reward, outcome.details, played)
        self._observations, self._acting = self._observe(outcome.calls), tuple(outcome.calls)
        agents = list(self.agents)
        return (dict(self._observations), {a: 0.0 for a in agents}, {a: False for a in agents}, {a: False for a in agents}, self._infos(played, {}))

    def render(self) -> str | None:
        if self.render_mode is None:
            return None
        lines = [f"program {self.name} | item {self.item_index}"]
        for t, record in enumerate(self.steps):
            lines.append(f"--- step {t} ---")
            for agent, (observation, reply) in record.items():
                lines.append(f"[{agent}] sees: {observation}")
                lines.append(f"[{agent}] says: {reply}")
        return "\n".join(lines)

    def eval_split(self) -> "ProgramEnv | None":
        """A new env playing the same program on ``eval_items`` (None without them): the eval
        split a learner evaluates on when it is given no ``eval_env``."""
        if self.eval_items is None:
            return None
        return ProgramEnv(self.program, self.possible_agents, self.eval_items, num_turns=self.num_turns, timeout_s=self.timeout_s,
                          on_program_error=self.on_program_error, error_penalty=self.error_penalty, name=self.name,
                          render_mode=self.render_mode)

    def close(self) -> None:
        """End the running program and stop the endpoint."""
        self._release()
        self._endpoint.close()

    # --- branching ------------------------------------------------------------------------------

    def fork(self) -> "ProgramEnv":
        """An env in the same state with no program running: stepping it replays the recorded
        steps (module docstring)."""
        twin = copy.copy(self)
        twin.agents = list(self.agents)
        twin._observations = dict(self._observations)
        twin._run, twin._finalizer = None, None
        return twin

    def step_branches(self, joint_actions: Sequence[Mapping[str, str]]) -> list[ProgramBranch]:
        """Step one fork per joint action; this env's running program goes to the first (so this
        env, stepped again, would replay)."""
        branches = []
        for j, actions in enumerate(joint_actions):
            self._check_actions(actions)
            twin = self.fork()
            if j == 0 and self._run is not None:
                twin._adopt(self._run)
                self._run = None
                self._finalizer.detach()
                self._finalizer = None
            branches.append(ProgramBranch(twin, *twin.step(actions)))
        return branches

    # --- internals ------------------------------------------------------------------------------

    def _where(self, step: int | None = None) -> str:
        return f"program {self.name}, item {self.item_index}, step {len(self.steps) if step is None else step}"

    def _start(self) -> None:
        self._adopt(ProgramRun(self.program, self.item, self.possible_agents, self._endpoint))

    def _adopt(self, run: ProgramRun) -> None:
        self._run = run
        self._finalizer = weakref.finalize(self, run.cancel)

    def _release(self) -> None:
        """Cancel the running program, if any (its thread is joined)."""
        finalizer, self._finalizer, self._run = self._finalizer, None, None
        if finalizer is not None:
            finalizer()

    def _outcome(self) -> _Outcome:
        """Wait for the running program's next step or end."""
        run = self._run
        if not run.settle(self.timeout_s):
            self._release()
            return _Outcome("failed", {}, 0.0, {}, f"it did not reach its next call or return within timeout_s={self.timeout_s:g} s")
        if run.error is not None:
            self._release()
            return _Outcome("failed", {}, 0.0, {}, run.error)
        if not run.done:
            return _Outcome("calls", run.heads(), 0.0, {}, None)
        self._release()
        result = run.result
        value, details = (result if isinstance(result, tuple) and len(result) == 2 else (result, {}))
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not math.isfinite(float(value)):
            return _Outcome("failed", {}, 0.0, {}, f"it returned {result!r:.80}, not a finite number (or (number, details dict))")
        if not isinstance(details, Mapping):
            return _Outcome("failed", {}, 0.0, {}, f"it returned details {details!r:.80}, not a dict")
        return _Outcome("done", {}, float(value), dict(details), None)

    def _replay(self) -> None:
        """Bring a fresh run to this env's state, answering the recorded calls."""
        for t, record in enumerate(self.steps + ({a: (self._observations[a], None) for a in self._acting},)):
            outcome = self._outcome()
            if outcome.kind != "calls":
                what = f"failed ({outcome.error})" if outcome.kind == "failed" else "returned"
                raise ProgramDivergenceError(f"{self._where(t)}: on replay the program {what} where the recording has calls of {list(record)}; a program must be deterministic given its replies")
            if list(outcome.calls) != list(record):
                self._release()
                raise ProgramDivergenceError(f"{self._where(t)}: on replay the program called {list(outcome.calls)} where the recording has {list(record)}; a program must be deterministic given its replies")
            for agent, (observation, reply) in record.items():
                if outcome.calls[agent] != observation:
                    self._release()
                    raise ProgramDivergenceError(
                        f"{self._where(t)}: the replayed call of agent {agent!r} differs from the recorded one at "
                        f"{first_difference(observation, outcome.calls[agent])}; a program must be deterministic given its replies"
                    )
            if t < len(self.steps):
                self._run.answer({agent: reply for agent, (_, reply) in record.items()})

    def _observe(self, calls: Mapping[str, Any]) -> dict[str, Any]:
        return {a: calls.get(a, NO_CALL) for a in self.possible_agents}

    def _infos(self, turn: int, details: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        acting = list(self._acting) if self.agents else []
        return {a: {"turn": turn, "index": self.item_index, "reward_details": dict(details), "acting_agents": list(acting)} for a in self.agents}

    def _end(self, reward: float, details: Mapping[str, Any], played: int):
        agents = list(self.agents)
        self._release()
        infos = {a: {"turn": played, "index": self.item_index, "reward_details": dict(details), "acting_agents": []} for a in agents}
        self.agents, self._acting = [], ()
        self._observations = {a: NO_CALL for a in self.possible_agents}
        return ({a: NO_CALL for a in agents}, {a: reward for a in agents}, {a: True for a in agents}, {a: False for a in agents}, infos)

    def _check_actions(self, actions: Mapping[str, str]) -> None:
        check_joint_action(actions, self.agents, self._acting, self._where())
