"""What a run leaves behind and how it survives: the run folder and its identity (run_folder,
run_dir), checkpoints with exact resume (checkpoint), metric logs (logging), recorded rollout
trees (recording), stopping on a signal (interrupt) and the torchrun helpers (distributed).

Nothing here imports a trainer: the trainers in :mod:`llm_marl.learners` call into these modules.
The old paths ``llm_marl.learners.<module>`` still import, with a ``DeprecationWarning``.
"""
