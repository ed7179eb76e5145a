"""llm_marl: train teams of language models to cooperate with reinforcement learning."""

from llm_marl.envs import DialogueEnv, make, register
from llm_marl.tasks import CooperativeTask, FunctionTask, Turn

__all__ = ["CooperativeTask", "DialogueEnv", "FunctionTask", "Turn", "make", "register"]
