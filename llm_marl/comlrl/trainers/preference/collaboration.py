"""CoMLRL's ``comlrl.trainers.preference.collaboration``: one joint policy writing every role's
answer, seen from the environment (roles split only for task rewards and metrics).

llm_marl's centralized learners do this in :class:`llm_marl.learners.reinforce.centralized.CentralizedEnv`;
here are CoMLRL's helpers for scripts that call them directly:

- :func:`joint_sequence_log_prob`: the log-probability of a whole joint answer (every token up
  to the first pad, the EOS included), earlier roles in the causal context;
- :class:`CentralizedCollaboration`: the joint prompt, the split of a joint answer into roles
  (an unparsable answer gives every role ``""``), the joint task reward, the per-role evaluation
  outputs and per-role metrics;
- :func:`joint_policy_gradient_loss` is a CoMLRL trainer internal: it raises, naming the llm_marl way.
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import copy
from typing import Any, Callable

import torch

from llm_marl.comlrl.trainers.preference.centralized import CentralizedComparatorParseError
from llm_marl.comlrl.utils.distributed import unwrap_model
from llm_marl.comlrl.utils.formatters import build_formatters
from llm_marl.comlrl.utils.reward_utils import call_reward_function, resolve_reward_range
from llm_marl.comlrl.utils.tokenizer_utils import apply_tokenizer_specials


def _answer_end(completion_ids: torch.Tensor, tokenizer: Any) -> int:
    """Tokens of the answer: up to the first pad (the pad included when it is also the EOS)."""
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        return completion_ids.numel()
    pads = (completion_ids == pad_id).nonzero()
    if not pads.numel():
        return completion_ids.numel()
    return int(pads[0].item()) + (1 if pad_id == tokenizer.eos_token_id else 0)


def joint_sequence_log_prob(agent: Any, tokenizer: Any, prompt_ids: torch.Tensor, completion_ids: torch.Tensor) -> torch.Tensor:
    """Sum of the log-probabilities of the joint answer's tokens after ``prompt_ids`` (with gradients;
    the model is put in train mode). An empty answer gives a zero that backpropagates to nothing."""
    model = unwrap_model(agent)
    device = next(model.parameters()).device
    apply_tokenizer_specials(tokenizer, [model])
    prompt_ids = prompt_ids.to(device).clone()  # generated under inference_mode: autograd needs plain tensors
    completion_ids = completion_ids.to(device).clone()
    completion_ids = completion_ids[:_answer_end(completion_ids, tokenizer)]
    if not completion_ids.numel():
        return torch.zeros((), device=device, requires_grad=True)
    if not prompt_ids.numel():
        raise ValueError("Centralized training requires a non-empty tokenized prompt.")
    model.train()
    inputs = torch.cat([prompt_ids, completion_ids[:-1]]).unsqueeze(0)
    logits = model(input_ids=inputs, attention_mask=torch.ones_like(inputs), use_cache=False).logits[0, prompt_ids.numel() - 1:]
    return logits.float().log_softmax(-1).gather(1, completion_ids[:, None]).sum()


def joint_policy_gradient_loss(trainer: Any, agent: Any, completions_data: Any, returns: Any, *, sequence_log_prob: Any = None) -> Any:
    """Not served: a CoMLRL trainer internal."""
    raise NotImplementedError("joint_policy_gradient_loss is a CoMLRL trainer internal; llm_marl's centralized "
                              "trainers (CentralizedMAGRPOTrainer, centralized MADPO/MARLHF) compute their joint loss in train()")


class CentralizedCollaboration:
    """Joint text for learning; roles split only for task rewards and metrics."""

    def __init__(self, adapter: Any, formatters: Any, reward_func: Callable[..., Any], num_roles: int):
        self.adapter = adapter
        self.num_roles = num_roles
        self.formatters = build_formatters(formatters, num_roles, pass_none_external_prompts=False)
        self.reward_func = reward_func
        self.reward_range = resolve_reward_range(reward_func)

    def build_prompt(self, item: dict[str, Any]) -> str:
        """The adapter's joint prompt from every role's formatted prompt; ``ValueError`` when empty."""
        prompt = self.adapter.build_prompt(item, [formatter(item) for formatter in self.formatters])
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("Centralized adapter must build a non-empty prompt.")
        return prompt

    def split(self, completion: str, item: dict[str, Any]) -> list[str]:
        """One string per role (all ``""`` when the adapter cannot parse the answer)."""
        try:
            outputs = self.adapter.parse_completion(completion, item, self.num_roles)
        except CentralizedComparatorParseError:
            outputs = [""] * self.num_roles
        if isinstance(outputs, (str, bytes)):
            raise TypeError("Centralized adapter must return a sequence of strings.")
        outputs = list(outputs)
        if len(outputs) != self.num_roles:
            raise ValueError(f"Centralized adapter must return exactly {self.num_roles} outputs.")
        if not all(isinstance(output, str) for output in outputs):
            raise TypeError("Centralized adapter outputs must all be strings.")
        return outputs

    def __call__(self, completions: Sequence[str], *, prompts: Any = None, batch_items: Any = None) -> list[float]:
        """One joint reward per joint answer: the reward function on its roles' answers."""
        if not batch_items:
            raise ValueError("Centralized task rewards require batch_items.")
        if len(batch_items) not in {1, len(completions)}:
            raise ValueError("Centralized completions must align with batch_items.")
        rewards = []
        for i, completion in enumerate(completions):
            item = batch_items[0] if len(batch_items) == 1 else batch_items[i]
            roles = self.split(completion, item)
            values = call_reward_function(self.reward_func, [self.formatters[0](item)], [[answer] for answer in roles],
                                          num_agents=self.num_roles, batch_items=[item])
            if len(values) != 1:
                raise ValueError("Centralized task reward must return one joint reward.")
            rewards.append(values[0])
        return rewards

    def split_eval(self, joint_turns: Sequence[Sequence[Sequence[str]]], items: Sequence[dict[str, Any]]) -> list[list[list[str]]]:
        """Per role, per item, the role's answer at each turn."""
        if len(joint_turns) != 1 or len(joint_turns[0]) != len(items):
            raise ValueError("Centralized evaluation outputs must align with items.")
        outputs: list[list[list[str]]] = [[] for _ in range(self.num_roles)]
        for turns, item in zip(joint_turns[0], items):
            rows = [self.split(completion, item) for completion in turns]
            for role in range(self.num_roles):
                outputs[role].append([row[role] for row in rows])
        return outputs

    def wrap_metrics_callback(self, callback: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        """``callback`` on per-role copies of the joint samples (``agent_idx`` the role, ``completion`` its answer)."""
        def role_metrics(rollouts: list[Any]) -> Any:
            samples = []
            for sample in rollouts:
                for role, answer in enumerate(self.split(sample.completion, sample.metadata["batch_item"])):
                    role_sample = copy(sample)
                    role_sample.agent_idx, role_sample.completion = role, answer
                    samples.append(role_sample)
            return callback(samples)

        return role_metrics


__all__ = ["CentralizedCollaboration", "joint_policy_gradient_loss", "joint_sequence_log_prob"]
