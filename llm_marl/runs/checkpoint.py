"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is the folder ``output_dir/checkpoint-{global_step}`` holding

- ``trainer_state.json``: the :class:`~llm_marl.learners.reinforce.trainer.TrainerState`, the config and
  the run (``run_id`` of the run folder's ``run.json``, and when it was written);
- ``agent_{i}/policy.pt`` and ``agent_{i}/optimizer.pt``: each agent's weights (policy
  ``state_dict``) and optimizer state, plus ``agent_{i}/reference.pt`` with reference KL;
- ``rng.pt``: Python, NumPy, torch (and CUDA) RNG states, the policies' own generators and the
  envs' item generators;
- ``buffers.pt``: the per-agent rollout buffers, the metrics not yet logged and the rest of an
  update (and of its batch) that ``max_steps`` cut;
- under torchrun those two are each rank's own: rank 0's at the top, rank r's in ``rank_<r>/``
  (``trainer_state.json`` records the number of ranks; :func:`load` gives each rank its own, and
  refuses another number of ranks unless no rank's buffers hold a sample);
- ``{name}.pt`` for each of the trainer's ``checkpoint_extras()`` (actor-critic: ``critic_{i}.pt``
  and ``critic_{i}_optimizer.pt``);
- ``manifest.json``, written last: the size and SHA-256 of every other file.

Writes are atomic: files go to a hidden temporary folder that is renamed into place only when
complete, so a crash while writing never leaves a ``checkpoint-*`` that loads wrongly, and the
previous checkpoint stays usable. On load the manifest is verified; ``resolve(True, dir, run_id)``
picks the newest checkpoint of that run (by the time it was written) that verifies, warning about
any newer one that does not. Only the newest ``save_total_limit`` checkpoints of the run are kept;
another run's checkpoints are never deleted, and one in the way of a new checkpoint of the same
name is moved aside to ``checkpoint-N.replaced-<time>`` with a warning (``run_folder.py``) —
unless it holds the same state (:func:`same_state`: the manifests' hashes agree, e.g. a finished
run resumed re-saves its last checkpoint), which is replaced without a copy.

When a trainer writes one (``trainer.train``): every ``save_steps`` optimizer steps, and when
training ends or SIGINT/SIGTERM stops it unless ``save_final_checkpoint`` is False — which the
drop-in (CoMLRL-keyword) constructor makes it by default without ``save_steps``, as CoMLRL writes
weights only when asked (``save_model``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import time
import warnings
from typing import Any

import torch

from llm_marl.policies.weight_changes import weights_changed
from llm_marl.runs import run_folder
from llm_marl.runs.rng import restore_rng, rng_state
from llm_marl.runs.run_folder import RESUMABLE_FIELDS

_PATTERN = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not match the trainer."""


def save(trainer: Any) -> str:
    """Write a checkpoint of ``trainer`` into its output_dir and return its path. Sharded agents
    (``fsdp=True``): every rank calls it and writes its own shards of their weights and optimizer
    states with ``torch.distributed.checkpoint`` (``agent_{i}/shards/``); rank 0 writes the rest."""
    output_dir = trainer.args.output_dir
    if output_dir is None:
        raise CheckpointError("cannot save a checkpoint: output_dir is None")
    name = f"checkpoint-{trainer.state.global_step}"
    final = os.path.join(output_dir, name)
    tmp = os.path.join(output_dir, f".tmp-{name}-{os.getpid()}")
    sharded = getattr(trainer, "sharded", None) or {}
    dist = trainer.dist
    if dist.is_main:
        os.makedirs(output_dir, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    if dist.enabled:
        tmp = dist.broadcast_object(tmp)  # rank 0's folder, once it exists
    if sharded:
        from llm_marl.runs.fsdp import save_shards

        references = getattr(trainer, "sharded_references", {})
        for i, agent in enumerate(trainer.agent_ids):
            if agent in sharded and not sharded[agent].frozen:  # (a LoRA team's adapters are whole: rank 0 saves them below)
                save_shards(sharded[agent], trainer.optimizer_by_agent.get(agent), os.path.join(tmp, f"agent_{i}", "shards"))
            if agent in references:
                save_shards(references[agent], None, os.path.join(tmp, f"agent_{i}", "reference_shards"))
        for folder, shard, optimizer in _critic_shards(trainer):
            save_shards(shard, optimizer, os.path.join(tmp, folder))
    if dist.enabled:
        if not dist.is_main:
            _save_rank_state(trainer, os.path.join(tmp, rank_folder(dist.rank)))
        dist.barrier()  # every rank's own state is written
        if not dist.is_main:
            dist.barrier()  # rank 0 completes the folder
            trainer.state.last_checkpoint = final
            return final
    state = dataclasses.replace(trainer.state, last_checkpoint=final)
    run_id = getattr(trainer, "run_id", None)
    run = {"run_id": run_id, "saved_ns": time.time_ns()}
    _write_json(
        os.path.join(tmp, "trainer_state.json"),
        {"state": dataclasses.asdict(state), "args": _jsonable(trainer.args.to_dict()), "run": run,
         "world_size": dist.world_size},
    )
    for i, agent in enumerate(trainer.agent_ids):
        folder = os.path.join(tmp, f"agent_{i}")
        os.makedirs(folder, exist_ok=True)
        policy = trainer.policies[agent]
        if agent in sharded and not sharded[agent].frozen:
            continue  # its weights, optimizer state and reference are the shards written above
        if hasattr(policy, "state_dict"):
            torch.save(policy.state_dict(), os.path.join(folder, "policy.pt"))
        if agent in trainer.optimizer_by_agent:
            torch.save(trainer.optimizer_by_agent[agent].state_dict(), os.path.join(folder, "optimizer.pt"))
        if trainer.reference_policies is not None and hasattr(trainer.reference_policies[agent], "state_dict"):
            torch.save(trainer.reference_policies[agent].state_dict(), os.path.join(folder, "reference.pt"))
    for name, extra in _extras(trainer).items():
        torch.save(extra.state_dict(), os.path.join(tmp, f"{name}.pt"))
    _save_rank_state(trainer, tmp)  # rank 0's own state: buffers.pt and rng.pt at the top
    _write_json(os.path.join(tmp, "manifest.json"), _manifest(tmp))
    _fsync_tree(tmp)
    written = trainer.__dict__.setdefault("_checkpoints_written", set())
    if os.path.exists(final) and (final in written or same_state(final, tmp)):
        # this trainer wrote it at this same step (e.g. the closing save), or it holds exactly
        # this state (a finished run resumed re-saves its last checkpoint): no conflict, no copy
        old = os.path.join(output_dir, f".old-{name}-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        if os.path.exists(final):
            own = run_id is not None and _run_of(final).get("run_id") == run_id
            whose = "this run before the checkpoint it resumed from" if own else "another run"
            aside = f"{final}.replaced-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            os.rename(final, aside)
            warnings.warn(f"{final} belonged to {whose}; moved it aside to {aside}")
        os.replace(tmp, final)
    written.add(final)
    trainer.state.last_checkpoint = final
    _rotate(output_dir, trainer.args.save_total_limit, keep=final, run_id=run_id)
    dist.barrier()  # the other ranks wait for the complete folder
    return final


def rank_folder(rank: int) -> str:
    """Where rank ``rank``'s own state lies inside a checkpoint: rank 0's at the top (as a
    single process writes it), rank r's in ``rank_<r>/``."""
    return "." if rank == 0 else f"rank_{rank}"


def _save_rank_state(trainer: Any, folder: str) -> None:
    """What is this rank's own into ``folder``: ``rng.pt`` (Python, NumPy, torch, the policies'
    and the envs' generators) and ``buffers.pt`` (the rollout buffers, the metrics not yet
    logged, the rest of an update and of its batch that ``max_steps`` cut, with samples held
    the marks that re-own them on resume, llm_marl/learners/staleness.py, and each agent's
    sampler-gap baseline and count of steps past its threshold, llm_marl/learners/update.py)."""
    os.makedirs(folder, exist_ok=True)
    torch.save(rng_state(trainer.policies, _envs(trainer)), os.path.join(folder, "rng.pt"))
    plan, unfinished = getattr(trainer, "_update_plan", None), _cut_batch(trainer)
    held = plan is not None or unfinished is not None or any(len(b) for b in trainer.buffers.values())
    torch.save(
        {"buffers": {a: list(b.samples) for a, b in trainer.buffers.items()}, "pending": trainer._pending,
         "update_plan": plan, "unfinished": unfinished,
         "samplers": trainer.sampler_marks() if held and hasattr(trainer, "sampler_marks") else None,
         "sampler_gaps": {"baselines": dict(trainer.__dict__.get("_gap_baselines", {})), "over": dict(trainer.__dict__.get("_gaps_over", {}))}},
        os.path.join(folder, "buffers.pt"),
    )


def _envs(trainer: Any) -> dict[str, Any]:
    """The trainer's envs whose item generators a checkpoint keeps (rng.py)."""
    return {name: env for name in ("env", "eval_env") if (env := getattr(trainer, name, None)) is not None}


def _rank_state_of(path: str, saved: dict[str, Any], dist: Any) -> str:
    """The folder of ``path`` holding this rank's own state. Written by as many ranks as now run:
    this rank's. Otherwise (another number of ranks) rank 0's, for every rank, where no rank's
    buffers hold a sample; else :class:`CheckpointError`: those samples belong to ranks that no
    longer exist, so the run would lose or repeat them."""
    written_by = int(saved.get("world_size", 1))
    if written_by == dist.world_size:
        return os.path.join(path, rank_folder(dist.rank))
    held = []
    for rank in range(written_by):
        extra = torch.load(os.path.join(path, rank_folder(rank), "buffers.pt"), weights_only=False)
        samples = sum(len(b) for b in extra["buffers"].values()) + len(extra.get("update_plan") or [])
        if samples or extra.get("unfinished") is not None:
            held.append(f"rank {rank}: {samples} sample(s)")
    if held:
        raise CheckpointError(
            f"{path}: written by {written_by} rank(s) whose buffers hold samples not yet trained on "
            f"({', '.join(held)}); resume it with {written_by} rank(s), not {dist.world_size} "
            "(or from a checkpoint whose buffers are empty)"
        )
    return path


def _critic_shards(trainer: Any) -> list[tuple[str, Any, Any]]:
    """``(folder, sharded model, optimizer)`` of each critic sharded with its own model (fsdp=True):
    its weights, value head and optimizer state go to ``critic_<i>_shards/``; MARLHF's sharded
    reward model to ``reward_model_shards/``."""
    names = list(getattr(trainer, "critic_by_agent", None) or {})
    optimizers = getattr(trainer, "critic_optimizers", {})
    found = [(f"critic_{names.index(name)}_shards", shard, optimizers.get(name))
             for name, shard in getattr(trainer, "sharded_critics", {}).items() if not shard.frozen]
    if getattr(trainer, "sharded_reward_model", None) is not None:  # MARLHF's reward model and its optimizer
        found.append(("reward_model_shards", trainer.sharded_reward_model, trainer.reward_optimizer))
    return found


def closing_wanted(trainer: Any) -> bool:
    """Whether train() writes a checkpoint when it ends or a signal stops it: an ``output_dir``
    and ``save_final_checkpoint`` not False (the drop-in constructor resolves None to
    ``save_steps > 0``: CoMLRL writes weights only when asked; anchor_compat.py)."""
    return trainer.args.output_dir is not None and trainer.args.save_final_checkpoint is not False


def save_closing(trainer: Any) -> str | None:
    """The closing checkpoint where :func:`closing_wanted` (every rank calls it: each writes its
    own state, rank 0 the rest); its path, or None."""
    if not closing_wanted(trainer):
        return None
    return save(trainer)


def save_if_due(trainer: Any, steps_before: int) -> str | None:
    """A checkpoint when the batch just trained crossed a multiple of ``save_steps`` optimizer
    steps (from ``steps_before``); its path, or None."""
    every = trainer.args.save_steps
    crossed = every and trainer.state.global_step // every > steps_before // every
    if crossed and trainer.args.output_dir is not None:
        return save(trainer)
    return None


def launch_of(trainer: Any) -> dict[str, Any]:
    """What the run is made of beyond its config (recorded in run.json; resume checks it): the
    env's name, each agent's policy class, and what the CLI adds in ``trainer.launch_identity``
    (env id, model, menu, train_items)."""
    env = trainer.env
    name = (getattr(env, "metadata", None) or {}).get("name") or type(getattr(env, "task", env)).__name__
    return {"env": name, "policies": {a: type(p).__name__ for a, p in trainer.policies.items()}, **trainer.launch_identity}


def claim_run_folder(trainer: Any, resume: str | bool | None) -> str | None:
    """Claim ``trainer.args.output_dir`` for its run (run_folder.py) and set ``trainer.run_id``;
    returns the checkpoint to resume, if any. A trainer that trains again continues its own run
    in its folder."""
    args, dist = trainer.args, trainer.dist
    out = args.output_dir
    if out is None:
        return resolve(resume, out) if resume else None
    held = run_folder.read_identity(out)
    if not resume and held is not None and held["run_id"] == trainer.run_id:
        return None  # train() again on this trainer: the same run continues
    if not resume:
        if dist.is_main:
            _, moved = run_folder.claim_new(out, args, launch_of(trainer))
            if moved:
                print(f"[llm_marl] moved the previous contents of {out} aside to {moved}")
        dist.barrier()
        trainer.run_id = run_folder.read_identity(out)["run_id"]
        return None
    held = run_folder.check_resume(out, args, launch_of(trainer))
    path = resolve(resume, out, held["run_id"] if held else None)
    saved = run_id_of(path)
    if held is not None and saved is not None and saved != held["run_id"]:
        raise run_folder.RunFolderError(f"{path} belongs to run {saved}, but {out} holds run {held['run_id']}")
    if held is None:  # a folder from before run identities, or a checkpoint from elsewhere
        held = run_folder.new_identity(args, run_id=saved, launch=launch_of(trainer))
        if dist.is_main:
            run_folder.write_identity(out, held)
    trainer.run_id = held["run_id"]
    return path


def same_state(path: str, other: str) -> bool:
    """True when checkpoints ``path`` and ``other`` hold the same training state: ``path`` is
    intact, every file but ``trainer_state.json`` has the same size and SHA-256 in both manifests,
    and ``trainer_state.json`` agrees on the state, the run id and the config fields a resume
    may not change (:data:`~llm_marl.runs.run_folder.RESUMABLE_FIELDS`). When it was written
    does not count."""
    try:
        manifests = [_read_json(os.path.join(folder, "manifest.json")) for folder in (path, other)]
        saved = [_read_json(os.path.join(folder, "trainer_state.json")) for folder in (path, other)]
    except (OSError, ValueError):
        return False
    files = [{rel: entry for rel, entry in m.items() if rel != "trainer_state.json"} for m in manifests]
    if files[0] != files[1]:
        return False

    def essence(data: dict[str, Any]) -> Any:
        args = {k: v for k, v in (data.get("args") or {}).items() if k not in RESUMABLE_FIELDS}
        return data.get("state"), (data.get("run") or {}).get("run_id"), args

    if essence(saved[0]) != essence(saved[1]):
        return False
    try:
        verify(path)  # its files are what its manifest says
    except CheckpointError:
        return False
    return True


def load(trainer: Any, path: str) -> None:
    """Restore ``trainer`` from checkpoint ``path`` (verified first)."""
    verify(path)
    saved = _read_json(os.path.join(path, "trainer_state.json"))
    if saved["args"].get("num_agents") != len(trainer.agent_ids):
        raise CheckpointError(f"{path}: saved for {saved['args'].get('num_agents')} agents, trainer has {len(trainer.agent_ids)}")
    for i, agent in enumerate(trainer.agent_ids):
        folder = os.path.join(path, f"agent_{i}")
        policy = trainer.policies[agent]
        sharded = (getattr(trainer, "sharded", None) or {}).get(agent)
        if sharded is not None and sharded.frozen:
            sharded = None  # a LoRA team's base: the agent's adapter is whole, saved as without fsdp
        if sharded is not None or os.path.isdir(os.path.join(folder, "shards")):
            if sharded is None or not os.path.isdir(os.path.join(folder, "shards")):
                raise CheckpointError(f"{path}: agent_{i} was saved {'un' if sharded else ''}sharded; resume with fsdp={not sharded}")
            from llm_marl.runs.fsdp import load_shards

            load_shards(sharded, trainer.optimizer_by_agent.get(agent), os.path.join(folder, "shards"))
        elif hasattr(policy, "load_state_dict") and os.path.exists(os.path.join(folder, "policy.pt")):
            policy.load_state_dict(torch.load(os.path.join(folder, "policy.pt"), weights_only=False))
        if agent in trainer.optimizer_by_agent and sharded is None:
            trainer.optimizer_by_agent[agent].load_state_dict(torch.load(os.path.join(folder, "optimizer.pt"), weights_only=False))
        reference = os.path.join(folder, "reference.pt")
        sharded_reference = getattr(trainer, "sharded_references", {}).get(agent)
        if sharded_reference is not None:
            from llm_marl.runs.fsdp import load_shards

            load_shards(sharded_reference, None, os.path.join(folder, "reference_shards"))
        elif trainer.reference_policies is not None and os.path.exists(reference):
            trainer.reference_policies[agent].load_state_dict(torch.load(reference, weights_only=False))
    for folder, shard, optimizer in _critic_shards(trainer):
        from llm_marl.runs.fsdp import load_shards

        load_shards(shard, optimizer, os.path.join(path, folder))
    for name, extra in _extras(trainer).items():
        file = os.path.join(path, f"{name}.pt")
        if not os.path.exists(file):
            raise CheckpointError(f"{path}: {name}.pt is missing (saved by a trainer without {name})")
        extra.load_state_dict(torch.load(file, weights_only=False))
    weights_changed()  # every sampling copy (bf16 shadow, packs) reads the loaded weights
    own = _rank_state_of(path, saved, trainer.dist)
    restore_rng(trainer.policies, torch.load(os.path.join(own, "rng.pt"), weights_only=False), _envs(trainer))
    extra = torch.load(os.path.join(own, "buffers.pt"), weights_only=False)
    from llm_marl.rollouts import RolloutBuffer

    keys = {a: a for a in extra["buffers"]}  # the saved key objects: saved again, the pickle is byte-identical
    trainer.buffers = {keys.get(a, a): RolloutBuffer(extra["buffers"][a]) for a in trainer.agent_ids}
    trainer._pending = extra["pending"]
    trainer._batch_notes_start = {}  # a cut batch's checkpoint holds only that batch's metrics
    # the rest of an update that max_steps cut, and its batch; a batch left by a failed update
    # belongs to the state replaced here
    trainer._update_plan = extra.get("update_plan")
    trainer._unfinished = extra.get("unfinished")
    trainer._restored_samplers = extra.get("samplers")  # re-owned once train() has set the weights (staleness.py)
    gaps = extra.get("sampler_gaps") or {}  # (absent from checkpoints written before 2026-12-03: recalibrated)
    trainer._gap_baselines, trainer._gaps_over = dict(gaps.get("baselines", {})), dict(gaps.get("over", {}))
    fields = {f.name for f in dataclasses.fields(trainer.state)}
    trainer.state = type(trainer.state)(**{k: v for k, v in saved["state"].items() if k in fields})
    trainer.resumed_from = {"checkpoint": path, "batch_step": trainer.state.batch_step}  # the command's summary reads it


def _cut_batch(trainer: Any) -> Any:
    """The batch whose update ``max_steps`` cut (saved: resuming finishes it), or None."""
    unfinished = getattr(trainer, "_unfinished", None)
    return unfinished if unfinished is not None and getattr(trainer, "_update_plan", None) is not None else None


def _extras(trainer: Any) -> dict[str, Any]:
    """What a trainer saves beside its agents (``checkpoint_extras()``: name -> object with
    ``state_dict``/``load_state_dict``, e.g. actor-critic critics and their optimizers)."""
    extras = getattr(trainer, "checkpoint_extras", None)
    return dict(extras()) if extras is not None else {}


def verify(path: str) -> None:
    """Raise CheckpointError unless every file of the manifest is present and intact."""
    manifest_path = os.path.join(path, "manifest.json")
    if not os.path.isdir(path):
        raise NoSuchCheckpoint(f"{path}: no such checkpoint folder")
    if not os.path.exists(manifest_path):
        raise CheckpointError(f"{path}: no manifest.json (the checkpoint was not completely written)")
    try:
        manifest = _read_json(manifest_path)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest.json ({exc})") from exc
    for rel, expected in manifest.items():
        file = os.path.join(path, rel)
        if not os.path.exists(file):
            raise CheckpointError(f"{path}: {rel} is missing")
        if os.path.getsize(file) != expected["size"] or _sha256(file) != expected["sha256"]:
            raise CheckpointError(f"{path}: {rel} is truncated or corrupted")


def list_checkpoints(output_dir: str) -> list[str]:
    """Checkpoint folders in ``output_dir``, oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), name) for name in os.listdir(output_dir) if (m := _PATTERN.match(name))]
    return [os.path.join(output_dir, name) for _, name in sorted(found)]


def run_checkpoints(output_dir: str, run_id: str | None) -> list[str]:
    """The checkpoints of run ``run_id`` in ``output_dir``, oldest written first (``run_id``
    None: every checkpoint, by step)."""
    paths = list_checkpoints(output_dir)
    if run_id is None:
        return paths
    runs = {path: _run_of(path) for path in paths}
    mine = [path for path in paths if runs[path].get("run_id") == run_id]
    return sorted(mine, key=lambda path: runs[path].get("saved_ns", 0))


class NothingToResume(CheckpointError):
    """Resume was asked for, but the run folder holds no checkpoint of the run."""


class NoSuchCheckpoint(CheckpointError):
    """The checkpoint folder named does not exist (a wrong path: bad usage, not a broken run)."""


def resolve(spec: str | bool, output_dir: str | None, run_id: str | None = None) -> str:
    """The checkpoint to resume from: ``spec`` itself, or for True the newest intact one of run
    ``run_id`` (None: of any run, by step)."""
    if spec is True:
        if output_dir is None:
            raise CheckpointError("resume_from_checkpoint=True needs args.output_dir")
        candidates = run_checkpoints(output_dir, run_id)
        for path in reversed(candidates):
            try:
                verify(path)
                return path
            except CheckpointError as exc:
                warnings.warn(f"skipping unusable checkpoint: {exc}")
        if candidates:
            raise CheckpointError(f"every checkpoint of the run in {output_dir} is damaged: {', '.join(candidates)}")
        others = len(list_checkpoints(output_dir))
        where = f" (its {others} checkpoint folder(s) belong to other runs)" if others else ""
        raise NothingToResume(
            f"nothing to resume in {output_dir}: no checkpoint of this run has been written yet{where}; "
            "start the run without resume"
        )
    verify(str(spec))
    return str(spec)


def run_id_of(path: str) -> str | None:
    """The run id recorded in checkpoint ``path`` (None for checkpoints written without one)."""
    return _run_of(path).get("run_id")


def _run_of(path: str) -> dict[str, Any]:
    try:
        return _read_json(os.path.join(path, "trainer_state.json")).get("run") or {}
    except (OSError, ValueError):
        return {}


def _rotate(output_dir: str, limit: int | None, keep: str, run_id: str | None) -> None:
    """Delete the oldest checkpoints of run ``run_id`` beyond ``limit`` (never another run's)."""
    if limit is None:
        return
    paths = run_checkpoints(output_dir, run_id)
    for path in paths[: max(0, len(paths) - limit)]:
        if os.path.abspath(path) != os.path.abspath(keep):
            shutil.rmtree(path, ignore_errors=True)


def _manifest(folder: str) -> dict[str, dict[str, Any]]:
    entries = {}
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            file = os.path.join(root, name)
            entries[os.path.relpath(file, folder)] = {"size": os.path.getsize(file), "sha256": _sha256(file)}
    return entries


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_tree(folder: str) -> None:
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())


def _write_json(path: str, data: Any) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)


def _read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data, default=str))
