"""What a task author touches."""

from llm_marl.tasks.base import CooperativeTask, TaskError, Turn
from llm_marl.tasks.function_task import FunctionTask

__all__ = ["CooperativeTask", "FunctionTask", "TaskError", "Turn"]
