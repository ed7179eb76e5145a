"""Sharded agents: FSDP2 (``torch.distributed.fsdp.fully_shard``) under torchrun (``fsdp=True``).

Each trainable full-model agent is sharded per decoder layer (``fully_shard`` on every layer, then
on the whole model) across the ranks of the torchrun group: each rank holds 1/W of every weight as
a ``DTensor`` shard, and so 1/W of its gradient and AdamW state. The trainer reaches the weights
only in three ways, each entered by every rank at the same point of the loop, so the collectives
never depend on what a rank's own items look like:

- **Sampling** (:meth:`ShardedModel.gathered`, once per batch's rollout and per evaluation): every
  layer is all-gathered once (``unshard()``), the decode loop runs on the full weights as many
  forward passes as this rank's trees need, then the layers are resharded. Peak: the full weights
  of every sharded agent, once, on top of the shards. ``fsdp_gather="layer"``: the models stay
  sharded, each forward gathers one layer at a time, and a :class:`Lockstep` keeps the ranks'
  passes in step.
- **Scoring and the update** (:meth:`ShardedModel.accumulating` then :meth:`ShardedModel.reduce`):
  the weights are gathered once per optimizer step, this rank's chunks are scored and
  back-propagated locally (any number of forward/backward passes, gradient checkpointing and
  chunking as without sharding; FSDP's per-layer gradient reduction is switched off), then ONE
  forward/backward of a single token, whose loss is 0, lets FSDP reduce-scatter the accumulated
  gradients layer by layer (summed, not averaged: the loss is already divided by the global
  sample count) and reshard. Peak: the full weights and their full gradient during the step.
- **Saving**: checkpoints write each rank's shards with ``torch.distributed.checkpoint``
  (:func:`save_shards` / :func:`load_shards`); ``save_model`` gathers the consolidated weights to
  rank 0 (:func:`save_consolidated`).

What each agent carries is sharded the same way: its reference model (a frozen copy made before
sharding), MARLHF's language-model reward model (:func:`fitting_sharded`) and, for the
actor-critic learners, a separate critic's model (:func:`shard_critics`;
the critics are built before the agents are sharded, and a critic's value head stays whole on
every rank). A LoRA team (:func:`shard_team`) shards its one frozen base; its adapters (and a
critic's value adapter) stay whole on every rank, trained as in data parallelism (gradients
summed over the ranks): its :class:`ShardedModel` is ``frozen`` (:meth:`ShardedModel.reduce`
only reshards) and its agents' checkpoints and ``save_model`` folders are the adapters, as
without fsdp. ``mixed_precision=True``: FSDP2's ``MixedPrecisionPolicy`` with bf16 gathered
weights (forward and backward) and fp32 gradient reduction into the fp32 shards.

Gradients are summed over ranks (``set_gradient_divide_factor(1.0)`` with sum-only reductions, which
gloo needs). Tested on CPU with gloo (tests/test_fsdp.py); CUDA with NCCL is the same code path
(``init_device_mesh("cuda")``) but untested here (``benchmarks/gpu_check.py`` checks it at one rank).
Under torchrun at one rank (a single GPU) the rank joins a process group of one and shards over it;
in a plain process ``fsdp=True`` is an error.
"""

from __future__ import annotations

import contextlib
from contextlib import ExitStack, contextmanager
from typing import Any, Iterable, Iterator

import torch

from llm_marl.policies.weight_changes import weights_changed, weights_follow

__all__ = [
    "Lockstep",
    "ShardedModel",
    "decoder_layers",
    "fitting_sharded",
    "full_state_dict",
    "gathered",
    "grad_norm",
    "is_sharded",
    "local_nbytes",
    "load_shards",
    "regather",
    "save_consolidated",
    "save_shards",
    "shard_agents",
    "shard_critics",
    "shard_model",
    "shard_team",
]


def is_sharded(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor (a shard of an FSDP parameter or its gradient)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without DTensor
        return False
    return isinstance(tensor, DTensor)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class is in HF's ``_no_split_modules`` (e.g.
    ``GPT2Block``, ``LlamaDecoderLayer``), else the elements of the largest ``ModuleList`` of
    same-class modules with parameters."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    found = [m for m in model.modules() if type(m).__name__ in names] if names else []
    if found:
        return found
    best: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > len(best):
            kinds = {type(child) for child in module}
            if len(kinds) == 1 and any(True for _ in module[0].parameters()):
                best = list(module)
    return best


def shard_agents(trainer: Any, optimizers: Any) -> dict[str, "ShardedModel"]:
    """``fsdp=True``: shard every agent's model (a LoRA team: its base, once) per decoder layer
    across the torchrun ranks, after giving every rank rank 0's weights, then their references and
    critics; a one-line error for what is not sharded (yet)."""
    name = type(trainer).__name__
    if not trainer._fsdp_supported:
        raise ValueError(f"fsdp=True is not supported by {name} yet (supported: MAGRPO, MAREINFORCE, MARLOO, MAReMax, MADPO, IAC, MAAC, MARLHF); train without fsdp")
    if trainer.args.reference_kl_enabled and trainer.args.reference_devices is not None:
        raise ValueError("fsdp=True shards each reference model across the ranks; reference_devices does not apply (leave it None)")
    world, shard = trainer.dist.world_size, trainer.args.fsdp_shard_size or trainer.dist.world_size
    if world % shard:
        raise ValueError(f"fsdp_shard_size={shard} must divide the number of ranks ({world}): groups of {shard} ranks shard, the groups replicate")
    if optimizers is not None:
        raise ValueError("fsdp=True builds each agent's optimizer over its shards; pass optimizers=None")
    for agent in trainer.agent_ids:
        policy = trainer.policies[agent]
        kind = type(policy).__name__
        if not isinstance(getattr(policy, "model", None), torch.nn.Module):
            raise ValueError(f"fsdp=True shards language-model agents; agent {agent!r} has a {kind} (train it without fsdp)")
        own = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
        if getattr(policy, "sample_dtype", None) not in (None, own):
            raise ValueError(f"fsdp=True: agent {agent!r} has sample_dtype={policy.sample_dtype!r}; sample in the model's own dtype (sample_dtype=None)")
    if not trainer.dist.enabled:
        from llm_marl.runs.distributed import join_process_group, launched_by_torchrun

        if not launched_by_torchrun():
            raise ValueError(
                "fsdp=True needs a torchrun process group (torchrun --nproc_per_node N ...); in a plain process train without fsdp"
            )
        join_process_group()  # torchrun at one rank: FSDP2 shards over a group of one (its collectives still run)
    if hasattr(trainer, "_make_reward_model") and getattr(trainer.args, "fsdp_gather", "model") == "layer":
        raise ValueError(f'fsdp_gather="layer" is not supported by {name} (its reward model is fit inside a sampling window); use fsdp_gather="model"')
    for prepare in ("_make_critics", "_make_reward_model"):  # critics and MARLHF's reward model copy agents' models
        if getattr(trainer, prepare, None) is not None:
            getattr(trainer, prepare)()
    from torch.distributed.device_mesh import init_device_mesh

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if shard == world:  # every rank holds 1/W of each weight
        mesh = init_device_mesh(device_type, (world,))
    else:  # a 2-D mesh: shard within groups of `shard` ranks, replicate across the groups (HSDP)
        mesh = init_device_mesh(device_type, (world // shard, shard), mesh_dim_names=("replicate", "shard"))
    sharded: dict[str, ShardedModel] = {}
    mixed = bool(getattr(trainer.args, "mixed_precision", False))  # bf16 compute, fp32 reduction and shards
    teams: dict[int, ShardedModel] = {}  # a LoRA team's base is sharded once, for all its agents
    for agent in trainer.agent_ids:
        policy = trainer.policies[agent]
        if device_type == "cuda":
            policy.to(torch.device("cuda", torch.cuda.current_device()))
        team = getattr(policy, "team", None)
        if team is not None and id(team) not in teams:
            trainer.dist.broadcast_parameters(team.model.parameters())
            teams[id(team)] = shard_team(team, mesh, mixed)
        if team is not None:
            sharded[agent] = teams[id(team)]
            continue
        trainer.dist.broadcast_parameters(policy.model.parameters())
        sharded[agent] = shard_model(policy.model, mesh, f"agent {agent!r}'s model", mixed=mixed)
    trainer.sharded_references = {}
    for agent, reference in (trainer.reference_policies or {}).items():  # frozen copies made before sharding
        if getattr(reference, "team", None) is not None:
            continue  # a team's reference is its own base with the adapters off: sharded above
        trainer.dist.broadcast_parameters(reference.model.parameters())
        trainer.sharded_references[agent] = shard_model(reference.model, mesh, f"agent {agent!r}'s reference model", mixed=mixed)
    trainer.sharded_critics = shard_critics(trainer, mesh, device_type, teams, mixed)
    trainer.sharded_reward_model = None
    reward = getattr(trainer, "reward_model", None)
    if getattr(reward, "is_language_model", False):  # MARLHF: the backbone sharded, the score head whole
        if device_type == "cuda":
            reward.to(torch.device("cuda", torch.cuda.current_device()))
        trainer.dist.broadcast_parameters(reward.parameters())
        trainer.sharded_reward_model = shard_model(reward.backbone, mesh, "the reward model", mixed=mixed)
        trainer.sharded_reward_model.checkpointed = reward
    for critic in (getattr(trainer, "critic_by_agent", None) or {}).values():  # a head on an agent's own model: saved with it
        owner = next((m for m in sharded.values() if getattr(critic, "shared", False) and m.model is getattr(critic, "model", None)), None)
        if owner is not None:
            owner.checkpointed = torch.nn.ModuleDict({"model": owner.model, "head": critic.head})
    return sharded


def shard_critics(trainer: Any, mesh: Any, device_type: str, teams: dict[int, "ShardedModel"], mixed: bool = False) -> dict[str, "ShardedModel"]:
    """Critic name -> the sharded model its values run on, for every language-model critic of an
    actor-critic trainer: a separate critic's own backbone, sharded per decoder layer (its value
    head stays whole on every rank, as a LoRA team's adapters do); a critic on a LoRA team's base
    (:class:`~llm_marl.policies.adapter_critic.AdapterCritic`): the team's sharded base. A critic
    on its actor's own model (``use_separate_critic=False``) runs inside the actor's update and
    needs none; a tabular critic is whole on every rank."""
    critics: dict[str, ShardedModel] = {}
    for name, critic in (getattr(trainer, "critic_by_agent", None) or {}).items():
        team = getattr(critic, "team", None)
        if team is not None:
            critics[name] = teams[id(team)]
        elif isinstance(getattr(critic, "model", None), torch.nn.Module) and not getattr(critic, "shared", False):
            if device_type == "cuda":
                critic.to(torch.device("cuda", torch.cuda.current_device()))
            trainer.dist.broadcast_parameters(critic.parameters())
            critics[name] = shard_model(critic.model, mesh, f"critic {name!r}'s model", mixed=mixed)
            critics[name].checkpointed = torch.nn.ModuleDict({"model": critic.model, "head": critic.head})
    return critics


def gathered(trainer: Any) -> ExitStack:
    """A context in which every sharded model of ``trainer`` (agents, their references, critics)
    holds its full weights; every rank enters it. Empty without fsdp. ``fsdp_gather="layer"``:
    the weights stay sharded and each forward gathers one layer at a time, the ranks' forwards
    kept in step by a :class:`Lockstep`."""
    stack = ExitStack()
    models = [*trainer.sharded.values(), *getattr(trainer, "sharded_references", {}).values(), *getattr(trainer, "sharded_critics", {}).values(),
              *[m for m in [getattr(trainer, "sharded_reward_model", None)] if m is not None]]
    models = list({id(m): m for m in models}.values())  # a team's agents share one base
    if models and getattr(trainer.args, "fsdp_gather", "model") == "layer":
        lockstep = trainer.__dict__.get("_lockstep")
        if lockstep is None:
            lockstep = trainer.__dict__["_lockstep"] = Lockstep(models)
        stack.enter_context(lockstep.window())
        return stack
    for model in models:
        stack.enter_context(model.gathered())
    return stack


class Lockstep:
    """``fsdp_gather="layer"``: inside :meth:`window` the models stay sharded and every forward
    pass gathers one layer at a time, a collective every rank must join. The ranks' rollouts make
    different numbers of passes through different models, so every pass goes in rounds: each rank
    announces the model it is about to run (or that it is done: -1), all run the lowest
    announced model (the announcers for real, the others a dummy one-token pass), and the rounds
    go on until every rank is done. Peak: one layer's full weights (per model) besides the shards."""

    def __init__(self, models: list["ShardedModel"]) -> None:
        self.models = models
        self.active = False
        self.serving = False
        for index, model in enumerate(models):
            model.model.register_forward_pre_hook(self._hook(index), prepend=True)  # before FSDP's own gathers

    def _hook(self, index: int) -> Any:
        def pre_forward(module: Any, args: Any) -> None:
            if self.active and not self.serving:
                self._serve(index)

        return pre_forward

    def _round(self, wanted: int) -> int:
        import torch.distributed as dist

        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        mine = torch.tensor([wanted], dtype=torch.long, device=device)
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        asked = [int(t.item()) for t in every if int(t.item()) >= 0]
        return min(asked) if asked else -1

    def _serve(self, wanted: int) -> None:
        """Rounds until one runs ``wanted`` (then this rank's own pass proceeds); -1: until all are done."""
        self.serving = True
        try:
            while True:
                chosen = self._round(wanted)
                if chosen < 0 or chosen == wanted:
                    return
                self.models[chosen].dummy_forward()
        finally:
            self.serving = False

    @contextmanager
    def window(self) -> Iterator[None]:
        for model in self.models:
            model.layered()
        self.active = True
        try:
            yield
        finally:
            self.active = False
            self._serve(-1)  # this rank is done: serve the others' passes until every rank is
            for model in self.models:
                model._reshard()


@contextmanager
def fitting_sharded(trainer: Any) -> Iterator[None]:
    """One optimizer step's forward/backward of MARLHF's sharded reward model (nothing without
    one), inside a sampling window. Every rank fits on every pair, so the reduce-scatter's sum is
    world-size times the gradient: the shards' gradients are divided back (the weights are then
    resharded: :func:`regather` once the fit's steps are done)."""
    sharded = getattr(trainer, "sharded_reward_model", None)
    if sharded is None:
        yield
        return
    try:
        with sharded.accumulating():
            yield
    finally:
        sharded.reduce()
        for p in sharded.model.parameters():
            if p.grad is not None:
                p.grad.div_(trainer.dist.world_size)


def regather(trainer: Any) -> None:
    """After :func:`fitting_sharded`'s steps: gather the stepped reward model again for the rest
    of the sampling window (nothing without one)."""
    sharded = getattr(trainer, "sharded_reward_model", None)
    if sharded is not None:
        with torch.no_grad():
            sharded._unshard()


def shared_value(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (every rank calls it)."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_shards(sharded: "ShardedModel", optimizer: Any, folder: str) -> None:
    """Each rank writes its shards of the model's weights and the optimizer's state into
    ``folder`` with ``torch.distributed.checkpoint`` (no rank gathers the full model)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(sharded.checkpointed, [optimizer] if optimizer is not None else [])
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)


def load_shards(sharded: "ShardedModel", optimizer: Any, folder: str) -> None:
    """Read :func:`save_shards`' ``folder`` into this rank's shards (every rank calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    optimizers = [optimizer] if optimizer is not None else []
    model_state, optimizer_state = get_state_dict(sharded.checkpointed, optimizers)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(sharded.checkpointed, optimizers, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def save_consolidated(sharded: "ShardedModel", policy: Any, target: str, is_main: bool) -> None:
    """Gather ``sharded``'s full weights to rank 0 (every rank calls this), which writes
    ``policy`` to ``target`` as one Hugging Face folder holding them. A LoRA team's agent
    (``sharded.frozen``): rank 0 writes its adapter, whole on every rank, in peft's format."""
    if sharded.frozen:
        if is_main:
            policy.save_pretrained(target)
        return
    full = full_state_dict(sharded.model)
    if is_main:
        policy.save_pretrained(target, state_dict=full)


def shard_model(model: torch.nn.Module, mesh: Any, where: str, ignored: set[torch.nn.Parameter] | None = None, frozen: bool = False,
                mixed: bool = False) -> "ShardedModel":
    """``fully_shard`` each decoder layer of ``model``, then ``model`` itself, on ``mesh``
    (in place: the module's class becomes its FSDP subclass, its parameters DTensor shards).
    ``ignored``: parameters left whole on every rank; ``frozen``: no sharded weight trains;
    ``mixed``: bf16 gathered weights (forward, backward), fp32 gradient reduction."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"fsdp=True: {where} has no decoder layers to shard (no _no_split_modules, no ModuleList of blocks)")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else MixedPrecisionPolicy()
    for layer in layers:
        fully_shard(layer, mesh=mesh, ignored_params=ignored, mp_policy=policy)
    fully_shard(model, mesh=mesh, ignored_params=ignored, mp_policy=policy)
    return ShardedModel(model, frozen=frozen)


def shard_team(team: Any, mesh: Any, mixed: bool = False) -> "ShardedModel":
    """A LoRA team (:class:`~llm_marl.policies.LoRATeam`): its frozen base sharded per decoder
    layer; the adapters (every ``lora_*`` parameter) stay whole on every rank, replicated as in
    data parallelism (their gradients are summed over the ranks like any unsharded parameter's)."""
    adapters = {p for name, p in team.model.named_parameters() if ".lora_" in name}
    sharded = shard_model(team.model.get_base_model(), mesh, f"team {team.name!r}'s base", ignored=adapters, frozen=True, mixed=mixed)

    @contextmanager
    def unrouted() -> Iterator[None]:  # a dummy pass inside a routed team forward: plain rows
        saved, team.runner.segments = team.runner.segments, None
        try:
            yield
        finally:
            team.runner.segments = saved

    sharded.quiet = unrouted
    return sharded


class ShardedModel:
    """One FSDP2-sharded model and the three ways the trainer reaches it (module docstring)."""

    def __init__(self, model: torch.nn.Module, frozen: bool = False) -> None:
        from torch.distributed.fsdp import FSDPModule

        self.model = model
        self.frozen = frozen
        """The sharded weights never train (a LoRA team's base): :meth:`reduce` only reshards, and
        the agents' own weights (the adapters) are whole on every rank, saved as without fsdp."""
        self.checkpointed: torch.nn.Module = model
        """What a checkpoint holds (:func:`save_shards`): the model, or a critic's model and value head."""
        self.units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for unit in self.units:
            unit.set_gradient_divide_factor(1.0)  # the loss is already a mean over all ranks' samples
            unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
            if not frozen:
                unit.set_reduce_scatter_unused_params(True, recurse=False)  # every rank reduces every parameter
        self.gathers = 0
        """How many times the full weights were gathered (sampling windows and update steps)."""
        self.quiet: Any = contextlib.nullcontext
        """A context for :meth:`dummy_forward` (a LoRA team's base: no row routing)."""
        self._buffers_made = False

    def _unshard(self) -> None:
        for unit in self.units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        self.gathers += 1

    def _reshard(self) -> None:
        for unit in self.units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)

    def layered(self) -> None:
        """Before a ``fsdp_gather="layer"`` window: each unit reshards after its forward; the first
        time, each unit's full-weight buffer is made outside inference mode (one unit at a time)."""
        with torch.no_grad():
            for unit in self.units:
                unit.set_reshard_after_forward(True, recurse=False)
                if not self._buffers_made:
                    unit.unshard()
                    unit.reshard()
        self._buffers_made = True

    def dummy_forward(self) -> None:
        """One forward pass of one token, for its collectives only (:class:`Lockstep`)."""
        device = next(iter(self.model.parameters())).device
        token = torch.zeros((1, 1), dtype=torch.long, device=device)
        with torch.no_grad(), self.quiet():
            self.model(input_ids=token, attention_mask=torch.ones_like(token), use_cache=False)

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """The full weights for any number of forward passes without gradients (every rank enters).
        Gathering writes the full tensors: a change notice for them, so answers sampled with them
        carry the current weight version (llm_marl/learners/staleness.py)."""
        with torch.no_grad():
            self._unshard()
        weights_changed(list(self.model.parameters()))
        try:
            yield
        finally:
            self._reshard()

    @contextmanager
    def accumulating(self) -> Iterator[None]:
        """Full weights; forward/backward passes accumulate this rank's full gradients locally.
        The full tensors follow the shards' last change (an optimizer step on the shards is one
        of the full weights: answers drawn before it are not scored as drawn by them)."""
        shards = list(self.model.parameters())
        with torch.no_grad():
            self._unshard()
        weights_follow(list(self.model.parameters()), shards)
        for unit in self.units:
            unit.set_requires_gradient_sync(False, recurse=False)
            unit.set_reshard_after_backward(False, recurse=False)
        yield

    def reduce(self) -> None:
        """After :meth:`accumulating`: reduce-scatter (sum) every rank's gradients into the shards
        with one zero-loss forward/backward of one token, then reshard (every rank calls it)."""
        for unit in self.units:
            unit.set_requires_gradient_sync(True, recurse=False)
            unit.set_reshard_after_backward(True, recurse=False)
        if self.frozen:  # no sharded gradient to reduce: the adapters' are summed as in data parallelism
            self._reshard()
            return
        device = next(iter(self.model.parameters())).device
        was_training = self.model.training
        self.model.train()
        try:
            token = torch.zeros((1, 1), dtype=torch.long, device=device)
            out = self.model(input_ids=token, attention_mask=torch.ones_like(token), use_cache=False)
            (out.logits.float().sum() * 0.0).backward()
        finally:
            self.model.train(was_training)
            self._reshard()


def grad_norm(params: list[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """The total 2-norm of sharded gradients (their local shards' squares summed over the ranks
    of a shard group; gradients whole on every rank, already summed over the ranks, counted once),
    after clipping them to ``max_norm`` like ``clip_grad_norm_`` (coefficient ``max_norm /
    (norm + 1e-6)``, at most 1)."""
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    local = [g.to_local() if is_sharded(g) else g for g in grads]
    total = torch.zeros((), dtype=torch.float64)
    for g in grads:
        if is_sharded(g):
            total += g.to_local().detach().double().pow(2).sum().cpu()
    mesh = next((g.device_mesh for g in grads if is_sharded(g)), None)
    group = mesh.get_group(mesh.ndim - 1) if mesh is not None else None  # 2-D mesh: the shard group (replicas agree)
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    for g in grads:  # whole on every rank (a value head beside a sharded backbone): counted once
        if not is_sharded(g):
            total += g.detach().double().pow(2).sum().cpu()
    norm = total.sqrt().float()
    if max_norm is not None:
        coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in local:
            g.detach().mul_(coefficient.to(g.device, g.dtype))
    return norm


def local_nbytes(tensors: Iterable[Any]) -> int:
    """Bytes of the storages this rank holds for ``tensors`` (a DTensor's local shard; each
    storage counted once): what the process really keeps, measured, not computed from shapes."""
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        if tensor is None or not isinstance(tensor, torch.Tensor):
            continue
        local = tensor.to_local() if is_sharded(tensor) else tensor
        storage = local.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The consolidated weights on CPU on rank 0 (empty elsewhere); every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
