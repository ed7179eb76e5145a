"""CoMLRL's ``comlrl.trainers.preference.centralized``: the comparator adapters that turn every
role's prompt into one centralized prompt and split one centralized answer back into roles
(:mod:`llm_marl.learners.reinforce.centralized`). The preference trainers here are decentralized; the
adapters serve :class:`~llm_marl.comlrl.trainers.reinforce.centralized_magrpo.CentralizedMAGRPOTrainer`
and scripts that use them directly."""

from llm_marl.learners.reinforce.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
    check_adapter,
)

def centralized_keywords(positional: tuple, keywords: dict) -> dict:
    """CoMLRL's keywords of a centralized preference trainer (``args.collaboration_mode ==
    "centralized"`` and no ``env=``) as the env-native ones: the role env and the ONE actor
    (:func:`~llm_marl.comlrl.trainers.reinforce.centralized_magrpo.centralized_from_anchor_kwargs`);
    any other call unchanged."""
    args = keywords.get("args")
    if positional or args is None or getattr(args, "collaboration_mode", None) != "centralized" or keywords.get("env") is not None:
        return keywords
    from llm_marl.comlrl.trainers.reinforce.centralized_magrpo import centralized_from_anchor_kwargs

    rest = dict(keywords)
    own = {k: rest.pop(k) for k in list(rest) if k in ("args", "centralized_comparator_adapter", "reward_model", "reward_optimizer",
                                                         "metrics_callback", "critic_model", "critics", "optimizers")}
    env, eval_env, policy, _, args = centralized_from_anchor_kwargs(own.pop("args"), **rest)
    return {**own, "env": env, "policies": [policy], "args": args, "eval_env": eval_env}


__all__ = ["CentralizedComparatorAdapter", "CentralizedComparatorParseError", "TaggedCentralizedComparatorAdapter", "check_adapter"]
