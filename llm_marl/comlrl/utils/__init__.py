"""CoMLRL's ``comlrl.utils``: every name of CoMLRL 1.4.3's ``comlrl.utils.__all__`` (see
:mod:`llm_marl.comlrl`; each module's docstring says what llm_marl does differently)."""

from llm_marl.comlrl.utils.checkpoint import read_checkpoint_metadata
from llm_marl.comlrl.utils.distributed import DistributedContext, local_context, unwrap_model
from llm_marl.comlrl.utils.formatters import build_formatters
from llm_marl.comlrl.utils.model_loading import infer_model_name, resolve_model_sources
from llm_marl.comlrl.utils.reference_kl import (
    clone_reference_models,
    load_reference_models_from_sources,
    reference_kl_coef,
    reference_kl_enabled,
    reference_kl_for_sequence,
    resolve_reference_devices,
    validate_reference_kl_config,
)
from llm_marl.comlrl.utils.reward_processor import RewardProcessors
from llm_marl.comlrl.utils.reward_utils import call_reward_function, normalize_reward_lengths, resolve_reward_range, set_reward_range
from llm_marl.comlrl.utils.tokenizer_utils import apply_tokenizer_specials, ensure_pad_token, ensure_tokenizer, resolve_tokenizers

__all__ = [
    "DistributedContext",
    "RewardProcessors",
    "apply_tokenizer_specials",
    "build_formatters",
    "call_reward_function",
    "clone_reference_models",
    "ensure_pad_token",
    "ensure_tokenizer",
    "infer_model_name",
    "load_reference_models_from_sources",
    "local_context",
    "normalize_reward_lengths",
    "read_checkpoint_metadata",
    "reference_kl_coef",
    "reference_kl_enabled",
    "reference_kl_for_sequence",
    "resolve_model_sources",
    "resolve_reference_devices",
    "resolve_reward_range",
    "resolve_tokenizers",
    "set_reward_range",
    "unwrap_model",
    "validate_reference_kl_config",
]
