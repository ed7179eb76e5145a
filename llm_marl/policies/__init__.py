"""What acts: tabular, scripted and language-model policies (full models, or a team of LoRA
adapters on one base) behind one protocol; and what judges:
critics (tabular and language-model value heads) for the actor-critic learners.

The names below are imported on first use (as in :mod:`llm_marl`), so that reading
:mod:`llm_marl.policies.models` (``llm-marl models``) does not load torch."""

from llm_marl import _lazy_exports

__all__, __getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        "llm_marl.policies.adapter_critic": ("AdapterCritic",),
        "llm_marl.policies.base": ("Completion", "Policy"),
        "llm_marl.policies.causal_lm": ("CausalLMPolicy",),
        "llm_marl.policies.choice": ("ChoicePolicy",),
        "llm_marl.policies.critic": ("Critic", "joint_observation"),
        "llm_marl.policies.lm_critic": ("CausalLMCritic", "ValueHead"),
        "llm_marl.policies.lora_team": ("AdapterPolicy", "LoRATeam"),
        "llm_marl.policies.scripted": ("ScriptedPolicy",),
        "llm_marl.policies.tabular": ("TabularPolicy",),
        "llm_marl.policies.tabular_critic": ("TabularCritic",),
    },
)
