"""HF config.json variants and malformed checkpoints: transformers is the oracle for what a config
means; what we do not implement must fail loudly, naming the key or tensor, never load with
different logits."""
import dataclasses
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models
from tests.conftest import hf_logits

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 1e6}
_POP = object()  # as a value in `_edit`: remove the key


def _edit(path, **changes):
    """Rewrites config.json with `changes` (key=_POP removes key); returns path."""
    cfg = json.load(open(os.path.join(path, "config.json")))
    for k, v in changes.items():
        cfg.pop(k, None) if v is _POP else cfg.__setitem__(k, v)
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    return path


def _hf_from_disk(path):
    import torch
    from transformers import Qwen3ForCausalLM
    return Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _assert_matches_transformers(path, tokens_len=24, **load_kw):
    cfg, params = models.load_hf_checkpoint(path, **load_kw)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, tokens_len))
    ref = hf_logits(_hf_from_disk(path), tokens)
    np.testing.assert_allclose(np.asarray(models.forward(cfg, params, tokens)), ref, atol=1e-4, rtol=0)
    return cfg, params


@pytest.mark.parametrize("name", ["yarn", "yarn_legacy_rope_scaling", "yarn_all_knobs", "linear", "linear_legacy_type"])
def test_scaled_rope_matches_transformers(hf_qwen3, name):
    """transformers 5 keeps RoPE in `rope_parameters`; these used to be ignored (wrong logits)."""
    if name == "yarn":
        path, _ = hf_qwen3(rope_parameters=dict(YARN))
    elif name == "yarn_all_knobs":
        path, _ = hf_qwen3(rope_parameters={**YARN, "factor": 8.0, "attention_factor": 1.3, "beta_fast": 16,
                                            "beta_slow": 2, "truncate": False})
    elif name == "linear":
        path, _ = hf_qwen3(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5})
    else:  # transformers 4.x layout: rope_theta + rope_scaling at top level
        path, _ = hf_qwen3()
        yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
        scaling = yarn if name.startswith("yarn") else {"type": "linear", "factor": 2.0}
        _edit(path, rope_parameters=_POP, rope_theta=2e5, rope_scaling=scaling)
    cfg, params = _assert_matches_transformers(path, tokens_len=40)
    assert cfg.rope_scaling
    # the KV-cache path uses the same frequencies
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, 20))
    shape = (cfg.num_layers, 1, cfg.num_kv_heads, 32, cfg.head_dim)
    cache = (jnp.zeros(shape), jnp.zeros(shape))
    _, cache = models.forward_with_cache(cfg, params, tokens[:, :12], cache, jnp.array([0]))
    tail, _ = models.forward_with_cache(cfg, params, tokens[:, 12:], cache, jnp.array([12]))
    np.testing.assert_allclose(np.asarray(tail), np.asarray(models.forward(cfg, params, tokens))[:, 12:], atol=1e-4)


def test_absent_keys_mean_what_they_mean_to_transformers(hf_qwen3):
    """No head_dim -> 128 (not hidden/heads); no RoPE keys -> theta 1e4 (not 1e6); no
    tie_word_embeddings -> untied. Legacy top-level rope_theta with rope_scaling null works."""
    path = _edit(hf_qwen3(head_dim=128)[0], head_dim=_POP, rope_parameters=_POP, tie_word_embeddings=_POP)
    cfg, _ = _assert_matches_transformers(path)
    assert (cfg.head_dim, cfg.rope_theta, cfg.tie_word_embeddings) == (128, 10_000.0, False)
    legacy = _edit(hf_qwen3(rms_norm_eps=1e-5)[0], rope_parameters=_POP, rope_theta=3e5, rope_scaling=None)
    cfg, _ = _assert_matches_transformers(legacy)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.rope_scaling) == (3e5, 1e-5, ())
    # head_dim = hidden/heads but not written: transformers cannot load it either; the error says why
    short = _edit(hf_qwen3()[0], head_dim=_POP)
    with pytest.raises(ValueError, match="no head_dim; transformers' Qwen3 then uses 128"):
        models.load_hf_checkpoint(short)


@pytest.mark.parametrize("change, error, match", [
    (dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}), NotImplementedError, "dynamic"),
    (dict(rope_parameters={"rope_type": "longrope", "factor": 8.0, "rope_theta": 1e4}), NotImplementedError, "longrope"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
     NotImplementedError, "partial_rotary_factor"),
    (dict(attention_bias=True), NotImplementedError, "attention_bias"),
    (dict(use_sliding_window=True, sliding_window=4, layer_types=["full_attention", "sliding_attention"]),
     NotImplementedError, r"sliding_window=4, layers \[1\]"),
    (dict(use_sliding_window=True, sliding_window=4, max_window_layers=0, layer_types=_POP),
     NotImplementedError, "sliding-window"),
    (dict(hidden_act="gelu"), NotImplementedError, "hidden_act"),
    (dict(quantization_config={"quant_method": "fp8"}), NotImplementedError, "fp8"),
    (dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"]), ValueError, "Mixture-of-Experts"),
    (dict(architectures=["Qwen3ForSequenceClassification"]), ValueError, "Qwen3ForSequenceClassification"),
    (dict(model_type="mistral"), ValueError, "model_type='mistral'; supported: qwen3, qwen2, llama"),
    (dict(model_type="llama"), ValueError, r"architectures=\['Qwen3ForCausalLM'\]"),
], ids=["dynamic_rope", "longrope", "partial_rotary", "attention_bias", "sliding_layer_types",
        "sliding_max_window_layers", "gelu", "quantized", "moe", "seq_cls", "mistral", "llama_with_qwen3_class"])
def test_unimplemented_configs_raise_naming_the_key(hf_qwen3, tmp_path, change, error, match):
    path, _ = hf_qwen3()
    with pytest.raises(error, match=match) as e:
        models.load_hf_checkpoint(_edit(path, **change))
    assert "config.json" in str(e.value)


def test_sliding_window_switched_off_loads(hf_qwen3):
    """Real Qwen3 configs carry sliding_window/max_window_layers with use_sliding_window=false."""
    path, _ = hf_qwen3(use_sliding_window=False, sliding_window=4, max_window_layers=1)
    _assert_matches_transformers(path)


def test_checkpoint_variants_transformers_loads(hf_qwen3, tmp_path):
    """bf16 files (into fp32 and bf16), index-sharded files, names of a bare Qwen3Model, leftover tensors."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3Model
    path, hf = hf_qwen3()
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    _assert_matches_transformers(str(tmp_path / "bf16"))
    cfg, p16 = models.load_hf_checkpoint(str(tmp_path / "bf16"), dtype=jnp.bfloat16)
    assert p16["embed"].dtype == jnp.bfloat16 and cfg.compute_dtype == "bfloat16"
    hf.to(torch.float32).save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert os.path.exists(tmp_path / "sharded" / "model.safetensors.index.json")
    _assert_matches_transformers(str(tmp_path / "sharded"))
    # a bare Qwen3Model (e.g. embedding checkpoints) stores names without "model."
    tied, tied_hf = hf_qwen3(tie_word_embeddings=True)
    Qwen3Model(tied_hf.config).save_pretrained(tmp_path / "bare")
    bare = load_file(str(tmp_path / "bare" / "model.safetensors"))
    assert "embed_tokens.weight" in bare
    save_file({k[len("model."):]: v for k, v in load_file(os.path.join(tied, "model.safetensors")).items()},
              str(tmp_path / "bare" / "model.safetensors"), metadata={"format": "pt"})
    _assert_matches_transformers(str(tmp_path / "bare"))
    # unrelated tensors are ignored with a warning; old rotary buffers silently
    t = load_file(os.path.join(path, "model.safetensors"))
    t.update({"mtp.proj.weight": torch.zeros(3), "model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)})
    save_file(t, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with pytest.warns(UserWarning, match=r"ignoring 1 tensor.*mtp\.proj\.weight"):
        _assert_matches_transformers(path)


def _rewrite(path, fn):
    from safetensors.torch import load_file, save_file
    t = load_file(os.path.join(path, "model.safetensors"))
    fn(t)
    save_file(t, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path


def test_malformed_checkpoints_name_the_file_or_tensor(hf_qwen3, tmp_path):
    import torch
    # a wrong shape in a later layer (only layer 0 used to be checked -> a safetensors slicing error)
    path = _rewrite(hf_qwen3()[0], lambda t: t.__setitem__("model.layers.1.mlp.up_proj.weight", torch.zeros(40, 64)))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight has shape \(40, 64\), "
                                         r"config\.json implies \(96, 64\)"):
        models.load_hf_checkpoint(path)
    path = _rewrite(hf_qwen3()[0], lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(KeyError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight' is missing"):
        models.load_hf_checkpoint(path)
    path = _rewrite(hf_qwen3()[0], lambda t: t.pop("lm_head.weight"))
    with pytest.raises(KeyError, match="lm_head.weight"):
        models.load_hf_checkpoint(path)
    path = _rewrite(hf_qwen3()[0], lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.bias", torch.zeros(64)))
    with pytest.raises(ValueError, match=r"q_proj\.bias"):  # weights disagree with config.json: not dropped
        models.load_hf_checkpoint(path)
    path = _rewrite(hf_qwen3()[0], lambda t: t.__setitem__("model.norm.weight", torch.ones(64, dtype=torch.int8)))
    with pytest.raises(ValueError, match="model.norm.weight has dtype I8"):
        models.load_hf_checkpoint(path)
    _, hf = hf_qwen3()
    hf.save_pretrained(tmp_path / "shards", max_shard_size="20KB")
    os.remove(tmp_path / "shards" / json.load(open(tmp_path / "shards" / "model.safetensors.index.json"))
              ["weight_map"]["model.norm.weight"])
    with pytest.raises(FileNotFoundError, match="lists shard files that do not exist"):
        models.load_hf_checkpoint(str(tmp_path / "shards"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        models.load_hf_checkpoint(str(tmp_path / "nowhere"))
    (tmp_path / "no_config").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        models.load_hf_checkpoint(str(tmp_path / "no_config"))
    path, _ = hf_qwen3()
    with pytest.raises(NotADirectoryError, match="checkpoint directory"):
        models.load_hf_checkpoint(os.path.join(path, "config.json"))
    shutil.move(os.path.join(path, "model.safetensors"), os.path.join(path, "pytorch_model.bin"))
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin"):
        models.load_hf_checkpoint(path)


@pytest.mark.parametrize("tied", [False, True])
def test_export_round_trips_rope_and_config_fields(hf_qwen3, tmp_path, tied):
    """save_hf_checkpoint writes what transformers (and our loader) read back: scaled RoPE, head_dim,
    eps, tying; bf16 export into shards."""
    path, hf = hf_qwen3(tie_word_embeddings=tied, head_dim=24, rms_norm_eps=1e-5, rope_parameters=dict(YARN))
    cfg, params = models.load_hf_checkpoint(path)
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 30))
    for dtype, shard in ((None, 4 << 30), ("bfloat16", 30_000)):
        out = str(tmp_path / f"out_{dtype}")
        models.save_hf_checkpoint(out, cfg, params, dtype=dtype, max_shard_bytes=shard)
        reloaded = _hf_from_disk(out)
        assert reloaded.config.rope_parameters["rope_type"] == "yarn"
        assert reloaded.config.tie_word_embeddings == tied
        atol = 1e-5 if dtype is None else 0.05
        np.testing.assert_allclose(hf_logits(reloaded, tokens), hf_logits(hf, tokens), atol=atol)
        cfg2, _ = models.load_hf_checkpoint(out)
        assert cfg2 == cfg
    # the reagent_jax JSON form of the config (checkpoint.py) keeps the RoPE too
    assert models.Qwen3Config(**json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg
