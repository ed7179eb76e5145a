"""The natural gradient of a policy that answers from a menu, computed in the space of its logits.

A language model's prompts that differ in one token share almost all of their gradient: one
plain step moves every such prompt's menu logits by about the *sum* of what each prompt asked
for, and the difference between prompts (what the policy must learn when the best answer depends
on the prompt) is a small residue. A tabular policy has no such coupling. ``natural_gradient=True``
makes a step move the logits as the natural gradient of a table would (docs/games.md, "The
natural gradient"): ``z_o += lr x`` (about) the advantages of observation ``o``'s answers, soft
policy iteration, whatever the model couples.

Let ``z`` be the menu logits of a mini-batch's distinct observations (:meth:`menu_logits`),
``J = dz/dtheta`` (one row per menu entry), ``F_z`` the Fisher information of the answers in
those logits, block-diagonal with ``d_o (diag pi_o - pi_o pi_o^T)`` per observation (``d_o``:
its share of the mini-batch's samples), and ``G`` the loss gradient. The policy's Fisher matrix is
exactly ``J^T F_z J``, so the natural gradient is::

    D = (J^T F_z J + lam I)^{-1} G = (G - Jt^T (Jt Jt^T + lam I)^{-1} Jt G) / lam   (Woodbury)

with ``Jt = L^T J``, ``L L^T = F_z`` (:func:`fisher_factor`), and ``lam =
natural_gradient_damping x mean(diag J J^T)``. A step ``theta -= lr D`` changes ``z_o`` by about
``-lr F_z^+ g_o`` (``g = dL/dz``): for the policy gradient, ``lr`` times the importance-weighted
advantages of ``o``'s answers, so an answer of low probability is not stalled by it (the
damped natural gradient of overparameterized models: Zhang, Martens & Grosse, 2019; for softmax
policies, Kakade 2001, Agarwal et al. 2021). Use it with ``optim="sgd"``: AdamW rescales each
coordinate of ``D`` and undoes it.

Cost: one backward pass per distinct observation, vmapped over its menu's unit cotangents (the
work of one pass per menu entry, batched: 1.6x faster than a loop of them for SmolLM2's player 1),
an ``n x P`` matrix and an ``n x n`` solve. It needs the loss to depend on the weights only
through those logits, as the REINFORCE and actor losses, the entropy bonus and
the reference KL of a menu policy do. For a :class:`TabularPolicy` ``J``'s rows are unit
vectors: ``D = (F_z + lam I)^{-1} G`` row by row, ``lam = natural_gradient_damping``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import torch

from llm_marl.policies.base import take_token_entropy
from llm_marl.policies.tabular import observation_key

__all__ = ["fisher_factor", "gauss_newton_direction", "logit_jacobian", "precondition"]


def logit_jacobian(policy: Any, observations: Sequence[Any], params: Sequence[torch.nn.Parameter]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``(J, logits)``: ``J`` has one row per menu entry of each observation (in order), the
    gradient of that logit in ``params`` flattened and concatenated (float64, ``n x P``);
    ``logits`` each observation's menu logits (detached). Raises ``TypeError`` naming the policy
    where it has no ``menu_logits``."""
    if not hasattr(policy, "menu_logits"):
        raise TypeError(
            f"natural_gradient needs a policy that answers from a menu (a TabularPolicy, or a language model "
            f"with choice_answers=True); got {type(policy).__name__}"
        )
    rows, tables = [], []
    for observation in observations:
        logits = policy.menu_logits(observation)
        tables.append(logits.detach().double())
        # all of the observation's rows in one backward pass, vmapped over the menu's unit cotangents
        grads = torch.autograd.grad(logits, list(params), grad_outputs=torch.eye(logits.numel(), dtype=logits.dtype),
                                    is_grads_batched=True, allow_unused=True)
        rows.append(torch.cat([
            (g if g is not None else torch.zeros(logits.numel(), *p.shape, dtype=p.dtype)).reshape(logits.numel(), -1).double()
            for g, p in zip(grads, params)
        ], dim=1))
    take_token_entropy(policy)  # these scoring passes are not the step's answers
    if not rows:
        return torch.zeros(0, sum(p.numel() for p in params), dtype=torch.float64), tables
    return torch.cat(rows), tables


def fisher_factor(logits: torch.Tensor, weight: float) -> torch.Tensor:
    """``L`` with ``L L^T = weight (diag pi - pi pi^T)``, ``pi = softmax(logits)``: the Fisher
    information of one categorical answer in its logits. ``L = sqrt(weight) (diag sqrt(pi) -
    pi sqrt(pi)^T)`` (``M x M``)."""
    pi = torch.softmax(logits.double(), dim=-1)
    root = pi.sqrt()
    return weight**0.5 * (torch.diag(root) - pi[:, None] * root[None, :])


def gauss_newton_direction(grad: torch.Tensor, jacobian: torch.Tensor, lam: float) -> torch.Tensor:
    """``(J^T J + lam I)^{-1} grad`` (float64, like ``grad``) by the Woodbury identity, an
    ``n x n`` solve; ``grad`` unchanged where ``J`` has no rows or ``lam`` is not positive."""
    if jacobian.shape[0] == 0 or not lam > 0:
        return grad.clone()
    kernel = jacobian @ jacobian.T
    solved = torch.linalg.solve(kernel + lam * torch.eye(kernel.shape[0], dtype=kernel.dtype), jacobian @ grad)
    return (grad - jacobian.T @ solved) / lam


def precondition(policy: Any, params: Sequence[torch.nn.Parameter], observations: Sequence[Any], damping: float) -> None:
    """Replace the gradients of ``params`` by the natural gradient (module docstring):
    ``observations`` are the mini-batch's, one per sample (their counts are the ``d_o``)."""
    params = [p for p in params if p.requires_grad]
    if not params or all(p.grad is None for p in params) or not observations:
        return
    counts = Counter(observation_key(o) for o in observations)
    distinct = list({observation_key(o): o for o in observations}.values())
    jacobian, tables = logit_jacobian(policy, distinct, params)
    lam = damping * float((jacobian * jacobian).sum(dim=1).mean()) if jacobian.shape[0] else 0.0
    factors = [fisher_factor(z, counts[observation_key(o)] / len(observations)) for o, z in zip(distinct, tables)]
    fisher_rows = torch.block_diag(*factors).T @ jacobian if factors else jacobian  # L^T J
    grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in params])
    direction = gauss_newton_direction(grad, fisher_rows, lam)
    start = 0
    for p in params:
        size = p.numel()
        p.grad = direction[start : start + size].view_as(p).to(p.dtype).clone()
        start += size

