"""HF checkpoint I/O: round trips through transformers, sharded files, loading onto a mesh."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models
from tests.conftest import hf_logits
from tests.multidevice import run_with_devices


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_through_transformers(hf_qwen3, tmp_path, tied):
    import torch
    from transformers import Qwen3ForCausalLM
    path, hf = hf_qwen3(tie_word_embeddings=tied)
    cfg, params = models.load_hf_checkpoint(path)
    out = tmp_path / "exported"
    files = models.save_hf_checkpoint(str(out), cfg, params)
    assert len(files) == 1
    reloaded = Qwen3ForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32).eval()
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 10))
    np.testing.assert_allclose(hf_logits(reloaded, tokens), hf_logits(hf, tokens), atol=1e-5)
    np.testing.assert_allclose(np.asarray(models.forward(cfg, params, tokens)), hf_logits(reloaded, tokens), atol=1e-4)
    # and our own loader reads our own output back
    cfg2, params2 = models.load_hf_checkpoint(str(out))
    assert cfg2 == cfg
    np.testing.assert_array_equal(np.asarray(params2["embed"]), np.asarray(params["embed"]))


def test_sharded_multi_file_checkpoint(hf_qwen3, tmp_path):
    path, hf = hf_qwen3(num_hidden_layers=3)
    cfg, params = models.load_hf_checkpoint(path)
    out = tmp_path / "sharded"
    files = models.save_hf_checkpoint(str(out), cfg, params, max_shard_bytes=40_000)
    assert len(files) > 3
    index = json.load(open(out / "model.safetensors.index.json"))
    assert set(index["weight_map"].values()) == {os.path.basename(f) for f in files}
    cfg2, params2 = models.load_hf_checkpoint(str(out))
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, 8))
    np.testing.assert_allclose(np.asarray(models.forward(cfg2, params2, tokens)), hf_logits(hf, tokens), atol=1e-4)
    from transformers import Qwen3ForCausalLM
    reloaded = Qwen3ForCausalLM.from_pretrained(str(out)).eval()
    np.testing.assert_allclose(hf_logits(reloaded, tokens), hf_logits(hf, tokens), atol=1e-5)


def test_bfloat16_export_loads_in_transformers(hf_qwen3, tmp_path):
    import torch
    from transformers import Qwen3ForCausalLM
    path, _ = hf_qwen3()
    cfg, params = models.load_hf_checkpoint(path)
    models.save_hf_checkpoint(str(tmp_path / "bf16"), cfg, params, dtype="bfloat16")
    m = Qwen3ForCausalLM.from_pretrained(str(tmp_path / "bf16"))
    assert next(m.parameters()).dtype == torch.bfloat16
    cfg2, p2 = models.load_hf_checkpoint(str(tmp_path / "bf16"), dtype=jnp.bfloat16)
    assert p2["embed"].dtype == jnp.bfloat16 and cfg2.param_dtype == "bfloat16"


def test_bad_checkpoints_give_clear_errors(hf_qwen3, tmp_path):
    path, _ = hf_qwen3()
    cfg = json.load(open(os.path.join(path, "config.json")))
    bad = tmp_path / "bad"
    bad.mkdir()
    json.dump({**cfg, "hidden_size": 32}, open(bad / "config.json", "w"))
    os.symlink(os.path.join(path, "model.safetensors"), bad / "model.safetensors")
    with pytest.raises(ValueError, match="has shape"):
        models.load_hf_checkpoint(str(bad))
    empty = tmp_path / "empty"
    empty.mkdir()
    json.dump(cfg, open(empty / "config.json", "w"))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        models.load_hf_checkpoint(str(empty))
    llama = tmp_path / "llama"
    llama.mkdir()
    json.dump({**cfg, "model_type": "mistral"}, open(llama / "config.json", "w"))
    with pytest.raises(ValueError, match="model_type"):
        models.load_hf_checkpoint(str(llama))


def test_load_onto_8_devices_matches_single_device(hf_qwen3):
    """fsdp 4 x tensor 2: every leaf is placed with its rule-derived sharding, logits unchanged.
    The one-KV-head shape checks that non-dividing mesh axes fall back to replication."""
    for shape in (dict(num_attention_heads=4, num_key_value_heads=2, hidden_size=64),
                  dict(num_key_value_heads=1, tie_word_embeddings=True)):
        path, hf = hf_qwen3(**shape)
        tokens = np.random.default_rng(2).integers(0, 256, (4, 9))
        ref = hf_logits(hf, tokens)
        res = run_with_devices(f"""
      import json, jax, numpy as np
      from reagent_jax import models, parallel
      mesh = parallel.make_mesh(data=1, fsdp=4, tensor=2)
      cfg, params = models.load_hf_checkpoint({path!r}, mesh=mesh)
      specs = {{"/".join(str(getattr(k, 'key', k)) for k in p): str(x.sharding.spec)
               for p, x in jax.tree_util.tree_leaves_with_path(params)}}
      n_dev = {{len(x.sharding.device_set) for x in jax.tree.leaves(params)}}
      logits = models.forward(cfg, params, np.array({tokens.tolist()}), mesh=mesh)
      print(json.dumps({{"logits": np.asarray(logits).tolist(), "specs": specs, "n_dev": sorted(n_dev)}}))
    """)
        np.testing.assert_allclose(np.array(res["logits"]), ref, atol=1e-4)
        assert res["n_dev"] == [8]
        assert "fsdp" in res["specs"]["layers/mlp/gate"] and "tensor" in res["specs"]["layers/mlp/gate"]
        if shape.get("num_key_value_heads") == 1:
            assert "tensor" not in res["specs"]["layers/attn/k"]  # one KV head cannot split over tensor=2


def test_export_is_self_contained(tmp_path):
    """With the run's tokenizer the export loads in transformers as is (tokenizer files, special
    ids inside the vocabulary, generation config); without one, ids the vocabulary lacks (Qwen3's
    151645 for a 300-token compact tokenizer) are not written."""
    import json
    import transformers
    from reagent_jax import chat
    tok = chat.build_compact_tokenizer(["the cat sat on the mat", "a tool call and its answer"] * 20, vocab_size=300)
    cfg = models.preset("tiny", vocab_size=300, compute_dtype="float32")
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    models.save_hf_checkpoint(str(tmp_path / "with"), cfg, params, tokenizer=tok)
    back = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "with"))
    assert len(back) == len(tok) and back.encode("the cat sat") == tok.encode("the cat sat")
    hf = json.load(open(tmp_path / "with" / "config.json"))
    gen = json.load(open(tmp_path / "with" / "generation_config.json"))
    assert hf["eos_token_id"] == gen["eos_token_id"] == tok.eos_token_id < cfg.vocab_size
    transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "with"))
    models.save_hf_checkpoint(str(tmp_path / "without"), cfg, params)
    hf = json.load(open(tmp_path / "without" / "config.json"))
    assert "eos_token_id" not in hf and "bos_token_id" not in hf
    with pytest.raises(ValueError, match="tokenizer has"):
        models.save_hf_checkpoint(str(tmp_path / "bad"), models.preset("tiny", vocab_size=100), params, tokenizer=tok)
