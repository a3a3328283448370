"""Qwen3 / Qwen2 / Llama in pure functional Flax: configs, presets, forward / logprobs, HF checkpoint
and GGUF I/O."""
from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.presets import preset, preset_names
from reagent_jax.models.functional import (forward, forward_with_cache, init_params, param_axes,
                                           param_shapes, param_shardings, token_logprobs,
                                           top_logprobs)
from reagent_jax.models.gguf_io import convert_gguf, gguf_checkpoint, is_gguf_source, read_gguf, smollm2_gguf
from reagent_jax.models.hf_io import load_hf_checkpoint, save_hf_checkpoint, hf_state_dict

__all__ = ["Qwen3Config", "preset", "preset_names", "forward", "forward_with_cache", "init_params",
           "param_axes", "param_shapes", "param_shardings", "token_logprobs", "top_logprobs", "load_hf_checkpoint",
           "save_hf_checkpoint", "hf_state_dict", "convert_gguf", "gguf_checkpoint", "is_gguf_source",
           "read_gguf", "smollm2_gguf"]
