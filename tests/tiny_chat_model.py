"""A tiny Llama-shaped chat model for tests, built locally (no download).

``chat_tokenizer()``: a byte-level BPE trained on a few sentences, with ChatML's special tokens
(``<|im_start|>`` bos, ``<|im_end|>`` eos and pad) and a ChatML chat template.
``tiny_llama(tokenizer)``: a 2-layer Llama (grouped-query attention, tied embeddings) from a seed.
``write_gguf(model, tokenizer, path)``: both as one GGUF file, with the ``gguf`` package's writer,
in llama.cpp's layout (q/k rows permuted for its rotary embedding), as a converter would.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The sea is wide and the ship is small.",
    "Write one sentence about the weather today.",
    "You are a helpful assistant; answer briefly and kindly.",
    "Agents cooperate to write a story, one line each.",
    "system user assistant message content role",
] * 4


def chat_tokenizer(vocab_size: int = 320, add_bos: bool = True):
    """``add_bos``: the tokenizer puts ``<|im_start|>`` before a text when asked for special
    tokens (as Llama tokenizers put their bos), so a template that writes it already must not
    get it twice."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS, trainer=trainer)
    if add_bos:
        start = backend.token_to_id("<|im_start|>")
        backend.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", pair="<|im_start|> $A <|im_start|> $B", special_tokens=[("<|im_start|>", start)]
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    tokenizer.chat_template = CHATML
    return tokenizer


def tiny_llama(tokenizer, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    generator = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
            else:
                parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for q/k (the inverse of what a GGUF reader undoes)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(model, tokenizer, path: str | Path) -> Path:
    """Write ``model`` and ``tokenizer`` as one float32 GGUF file at ``path``."""
    import gguf

    config = model.config
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama-test")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]) if getattr(config, "rope_parameters", None) else config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    state = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab = state["vocab"]
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_unk_token_id(tokenizer.unk_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)

    names = {
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    }
    sd = {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(config.num_hidden_layers):
        for hf, short in names.items():
            weight = sd[f"model.layers.{i}.{hf}.weight"]
            if short == "attn_q":
                weight = _permute(weight, config.num_attention_heads)
            elif short == "attn_k":
                weight = _permute(weight, config.num_key_value_heads)
            writer.add_tensor(f"blk.{i}.{short}.weight", np.ascontiguousarray(weight))
    writer.add_tensor("output_norm.weight", sd["model.norm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
