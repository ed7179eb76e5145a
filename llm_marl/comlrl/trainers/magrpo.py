"""CoMLRL's older import path ``comlrl.trainers.magrpo``: MAGRPO (see :mod:`llm_marl.comlrl.trainers.reinforce.magrpo`)."""

from llm_marl.comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer

__all__ = ["MAGRPOConfig", "MAGRPOTrainer"]
