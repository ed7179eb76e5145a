"""What goes wrong with a program, as exceptions.

- :class:`ProgramError`: the program raised, hung past its timeout, called an unknown model or
  made calls past the env's horizon. A :class:`~llm_marl.tasks.base.TaskError`, so a learner
  with ``reward_error_policy="skip"`` drops the item's tree and shows the error (as for a task
  whose reward fails); ``ProgramEnv(on_program_error=...)`` can instead end the episode with a
  fixed reward.
- :class:`ProgramDivergenceError`: a replayed program (a fork of a rollout tree) made a call
  other than the recorded one. Not a task error: it means the program is not deterministic given
  its replies, which no item-skipping can repair, so it always stops the run.
"""

from __future__ import annotations

from llm_marl.tasks.base import TaskError


class ProgramError(TaskError):
    """A program's rollout failed (the message names the program, the item and the step)."""


class ProgramDivergenceError(RuntimeError):
    """A replayed call differs from the recorded one (the message names the call and the first
    differing message)."""
