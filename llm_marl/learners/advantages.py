"""The learners' advantage math, at the path DESIGN.md names (``llm_marl.learners.advantages``):
the functions of :mod:`llm_marl.advantages`, defined there, a floor below, so that the run records
(:mod:`llm_marl.runs.recording`) compute the same advantages without importing a learner."""

from llm_marl.advantages import (  # noqa: F401 (re-exported)
    BASELINES,
    Baseline,
    aggregate_children,
    agent_returns,
    answer_entropies,
    best_advantages,
    discounted_return,
    group_advantages,
    k3_kl,
    max_advantages,
    mean_advantages,
    normalize_advantages,
    policy_gradient_loss,
    raw_advantages,
    register_baseline,
    rloo_advantages,
    sample_losses,
    should_stop,
    zero_advantage,
)
