"""Loading a policy to serve or evaluate: weights + the tokenizer that goes with them + an engine.

A policy path is either
  * an HF checkpoint directory (config.json + safetensors, e.g. Qwen/Qwen3-8B downloaded), whose
    tokenizer is the directory's own when it has one, else the real Qwen3 tokenizer (offline); or
  * a reagent_jax params directory (`reagent_config.json`, e.g. the quickstart's
    `workdir/grpo/final`), whose tokenizer is looked for in the directory, then in
    `<workdir>/tokenizer` (two levels up, where the training stages keep it), else Qwen3's.
An explicit tokenizer path wins. The model's vocabulary must hold every tokenizer id.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Optional

from reagent_jax import chat, checkpoint, models
from reagent_jax.rollout import Engine

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Policy:
    cfg: models.Qwen3Config
    params: Any
    tokenizer: Any
    path: str
    kind: str  # "hf" | "reagent"
    tokenizer_path: Optional[str]  # None: the real Qwen3 tokenizer


def _has_tokenizer(d: str) -> bool:
    return os.path.isfile(os.path.join(d, "tokenizer.json"))


def find_tokenizer(path: str) -> Optional[str]:
    """The tokenizer directory that belongs with a checkpoint (see the module docstring)."""
    path = os.path.abspath(path)
    candidates = [path]
    if checkpoint.is_params_dir(path):
        candidates += [os.path.join(os.path.dirname(os.path.dirname(path)), "tokenizer"),
                       os.path.join(os.path.dirname(path), "tokenizer")]
    return next((c for c in candidates if _has_tokenizer(c)), None)


def load_policy(path: str, tokenizer_path: Optional[str] = None, *, dtype: Optional[str] = None,
                mesh=None) -> Policy:
    """Weights (placed on `mesh` when given), config and tokenizer of a checkpoint directory.
    dtype: parameter and compute dtype for HF checkpoints (default: float32). A GGUF file (or
    "smollm2") is converted once per machine to an HF directory first (models.gguf_checkpoint)."""
    if path and models.is_gguf_source(path):
        path = models.gguf_checkpoint(path)
    if not path or not os.path.isdir(path):
        raise FileNotFoundError(f"policy path {path!r} is not a directory (expected an HF checkpoint, a "
                                "reagent_jax params directory such as workdir/grpo/final, or a .gguf file)")
    if checkpoint.is_params_dir(path):
        cfg, params = checkpoint.load_params(path, mesh=mesh)
        kind = "reagent"
    elif os.path.exists(os.path.join(path, "config.json")):
        cfg, params = models.load_hf_checkpoint(path, dtype=dtype, mesh=mesh)
        kind = "hf"
    else:
        raise FileNotFoundError(f"{path} has neither reagent_config.json (reagent_jax params) nor config.json "
                                "(HF checkpoint)")
    tok_path = tokenizer_path or find_tokenizer(path)
    tok = chat.load_tokenizer(tok_path)
    if len(tok) > cfg.vocab_size:
        raise ValueError(f"the tokenizer ({tok_path or 'Qwen3'}) has {len(tok)} tokens but the model at {path} only "
                         f"{cfg.vocab_size} embeddings; pass the tokenizer the model was trained with")
    log.info("policy %s (%s, %d params) with tokenizer %s", path, kind, cfg.num_params(), tok_path or "Qwen3")
    return Policy(cfg, params, tok, os.path.abspath(path), kind, tok_path)


def default_model_name(path: str) -> str:
    """The name a served checkpoint answers to: its directory name, with the stage for
    training outputs ("workdir/grpo/final" -> "grpo-final")."""
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    if len(parts) >= 2 and (parts[-1] in ("final", "latest") or parts[-1].isdigit()):
        return f"{parts[-2]}-{parts[-1]}"
    return parts[-1] or "policy"


def build_engine(policy: Policy, *, num_slots: int = 64, max_len: int = 8192, prefill_chunk: int = 512,
                 decode_steps: int = 8, mesh=None, seed: int = 0, start: bool = True, raise_errors: bool = False,
                 **engine_kw) -> Engine:
    """A rollout engine over the policy, its background driver running when `start`. A serving
    engine: a failed device call ends only its requests (they get a 500), unless raise_errors."""
    engine = Engine(policy.cfg, policy.params, num_slots=num_slots, max_len=max_len, prefill_chunk=prefill_chunk,
                    decode_steps=decode_steps, mesh=mesh, tokenizer=policy.tokenizer, seed=seed,
                    raise_errors=raise_errors, **engine_kw)
    if start:
        engine.start_background()
    return engine
