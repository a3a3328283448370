"""HF safetensors checkpoints <-> reagent_jax params.

Loading reads tensor *slices*: with a mesh, every device shard is built by
`jax.make_array_from_callback` from just the rows/columns it owns (safetensors `get_slice`), so a
large checkpoint never needs a full host copy per device. Layers are stacked on a leading axis
(the `nn.scan` layout).

Layout conversions (HF stores Linear weights as [out, in]):
  q/k/v_proj [N*D, E] -> [E, N, D]     o_proj [E, H*D] -> [H, D, E]
  gate/up    [F, E]   -> [E, F]        down   [E, F]   -> [F, E]      lm_head [V, E] -> [E, V]
"""
from __future__ import annotations

import glob
import json
import os
import re
import warnings
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for safetensors)
import numpy as np
from jax.sharding import Mesh
from safetensors import safe_open
from safetensors.numpy import save_file

from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.functional import param_shapes, param_shardings
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules

_LAYER = "model.layers.{i}."
_WEIGHTS, _INDEX = "model.safetensors", "model.safetensors.index.json"
_FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")  # a non-persistent buffer some old exports saved


def _hf_layout(cfg: Qwen3Config):
    """Leaf path -> (HF name template, kind). `{i}` marks a stacked per-layer tensor."""
    m = {
        ("embed",): ("model.embed_tokens.weight", "copy"),
        ("final_norm", "scale"): ("model.norm.weight", "copy"),
        ("layers", "input_norm", "scale"): (_LAYER + "input_layernorm.weight", "copy"),
        ("layers", "post_attn_norm", "scale"): (_LAYER + "post_attention_layernorm.weight", "copy"),
        ("layers", "attn", "q"): (_LAYER + "self_attn.q_proj.weight", "heads_out"),
        ("layers", "attn", "k"): (_LAYER + "self_attn.k_proj.weight", "heads_out"),
        ("layers", "attn", "v"): (_LAYER + "self_attn.v_proj.weight", "heads_out"),
        ("layers", "attn", "o"): (_LAYER + "self_attn.o_proj.weight", "heads_in"),
        ("layers", "attn", "q_norm", "scale"): (_LAYER + "self_attn.q_norm.weight", "copy"),
        ("layers", "attn", "k_norm", "scale"): (_LAYER + "self_attn.k_norm.weight", "copy"),
        ("layers", "mlp", "gate"): (_LAYER + "mlp.gate_proj.weight", "T"),
        ("layers", "mlp", "up"): (_LAYER + "mlp.up_proj.weight", "T"),
        ("layers", "mlp", "down"): (_LAYER + "mlp.down_proj.weight", "T"),
    }
    if not cfg.qk_norm:
        del m[("layers", "attn", "q_norm", "scale")], m[("layers", "attn", "k_norm", "scale")]
    if cfg.qkv_bias:
        for name in "qkv":
            m[("layers", "attn", f"{name}_bias")] = (_LAYER + f"self_attn.{name}_proj.bias", "heads_vec")
    if cfg.o_bias:
        m[("layers", "attn", "o_bias")] = (_LAYER + "self_attn.o_proj.bias", "copy")
    if not cfg.tie_word_embeddings:
        m[("lm_head",)] = ("lm_head.weight", "T")
    return m


def _path_key(path) -> tuple[str, ...]:
    return tuple(getattr(p, "key", getattr(p, "name", str(p))) for p in path)


def _norm(s: slice, n: int) -> tuple[int, int]:
    start, stop, _ = s.indices(n)
    return start, stop


class _Reader:
    """Lazy access to the tensors of a (possibly multi-file) safetensors checkpoint.

    Files are picked as transformers picks them (model.safetensors, else the index); a directory
    with neither falls back to all its *.safetensors files. Names saved from a bare `Qwen3Model`
    (no "model." prefix, e.g. embedding checkpoints) are aliased to the causal-LM names.
    """

    def __init__(self, path: str):
        self.path = path
        single, index = os.path.join(path, _WEIGHTS), os.path.join(path, _INDEX)
        if os.path.isfile(single):
            where = self._scan([single])
        elif os.path.isfile(index):
            with open(index) as f:
                try:
                    weight_map = json.load(f)["weight_map"]
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f"{index} is not a safetensors index (no weight_map): {e!r}") from None
            where = {k: (os.path.join(path, v), k) for k, v in weight_map.items()}
            lost = sorted({fn for fn, _ in where.values() if not os.path.isfile(fn)})
            if lost:
                raise FileNotFoundError(f"{index} lists shard files that do not exist: {lost}")
        else:
            files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
            if not files:
                other = sorted(os.path.basename(f) for e in ("bin", "pt", "pth")
                               for f in glob.glob(os.path.join(path, f"*.{e}")))
                hint = f" (found {other}: only safetensors is read)" if other else ""
                raise FileNotFoundError(f"no *.safetensors files in {path}{hint}")
            where = self._scan(files)
        if "model.embed_tokens.weight" not in where and "embed_tokens.weight" in where:
            where = {(k if k.startswith(("model.", "lm_head.")) else "model." + k): v for k, v in where.items()}
        self.where = where
        self._handles = {}

    @staticmethod
    def _scan(files: list[str]) -> dict[str, tuple[str, str]]:
        where = {}
        for fn in files:
            try:
                with safe_open(fn, framework="np") as f:
                    keys = list(f.keys())
            except Exception as e:  # safetensors raises its own error type for bad headers
                raise ValueError(f"{fn} is not a readable safetensors file: {e}") from None
            for k in keys:
                if k in where:
                    raise ValueError(f"tensor {k!r} is stored twice: in {where[k][0]} and {fn}")
                where[k] = (fn, k)
        return where

    def slice(self, name: str):
        if name not in self.where:
            raise KeyError(f"tensor {name!r} is missing from the checkpoint in {self.path}")
        fn, stored = self.where[name]
        if fn not in self._handles:
            self._handles[fn] = safe_open(fn, framework="np")
        try:
            return self._handles[fn].get_slice(stored)
        except Exception as e:
            raise KeyError(f"tensor {stored!r} is not in {fn} (the index says it is): {e}") from None

    def close(self):
        self._handles.clear()


def _read_block(sl, kind: str, idx: list[tuple[int, int]], cfg: Qwen3Config, shape) -> np.ndarray:
    """Reads the part of one HF tensor that lands in target block `idx` (per target dim)."""
    if kind == "copy":
        return sl[tuple(slice(a, b) for a, b in idx)]
    if kind == "T":  # target [A, B] = hf[B, A].T
        (a0, a1), (b0, b1) = idx
        return sl[b0:b1, a0:a1].T
    d = cfg.head_dim
    if kind == "heads_vec":  # target [N, D] from hf [N*D]
        (n0, n1), (d0, d1) = idx
        return sl[n0 * d:n1 * d].reshape(n1 - n0, d)[:, d0:d1]
    if kind == "heads_out":  # target [E, N, D] from hf [N*D, E]
        (e0, e1), (n0, n1), (d0, d1) = idx
        blk = sl[n0 * d:n1 * d, e0:e1].T  # [e, n*D]
        return blk.reshape(e1 - e0, n1 - n0, d)[:, :, d0:d1]
    if kind == "heads_in":  # target [H, D, E] from hf [E, H*D]
        (n0, n1), (d0, d1), (e0, e1) = idx
        blk = sl[e0:e1, n0 * d:n1 * d].T  # [n*D, e]
        return blk.reshape(n1 - n0, d, e1 - e0)[:, d0:d1, :]
    raise ValueError(kind)


def _check_tensor(sl, name, kind, target_shape, hint=""):
    """Raises ValueError naming the tensor when its shape or dtype cannot be these params."""
    dtype = sl.get_dtype()
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"checkpoint tensor {name} has dtype {dtype}; expected one of {_FLOAT_DTYPES} "
                         f"(quantized checkpoints are not supported)")
    got = tuple(sl.get_shape())
    if kind == "copy":
        want = tuple(target_shape)
    elif kind == "T":
        want = tuple(target_shape[::-1])
    elif kind == "heads_vec":
        want = (target_shape[0] * target_shape[1],)
    elif kind == "heads_out":
        want = (target_shape[1] * target_shape[2], target_shape[0])
    else:
        want = (target_shape[2], target_shape[0] * target_shape[1])
    if got != want:
        raise ValueError(f"checkpoint tensor {name} has shape {got}, config.json implies {want}{hint}")


def _check_tensors(reader: _Reader, layout, cfg: Qwen3Config, shapes) -> None:
    """Every tensor the config needs has the right shape/dtype, in every layer. Unused tensors
    under `model.` mean config.json and the weights disagree (biases, more layers, experts):
    an error, since dropping them changes the model. Others (heads of other tasks, leftovers) are
    ignored with a warning, as transformers does."""
    hint = ""
    with open(os.path.join(reader.path, "config.json")) as f:
        if "head_dim" not in json.load(f):
            hint = " (config.json has no head_dim; transformers' Qwen3 then uses 128, and so do we)"
    expected = set()
    for key, (template, kind) in layout.items():
        shape = _leaf(shapes, key).shape
        for i in range(cfg.num_layers) if key[0] == "layers" else [None]:
            name = template.format(i=i) if i is not None else template
            expected.add(name)
            _check_tensor(reader.slice(name), name, kind, shape[1:] if i is not None else shape, hint)
    extra = sorted(n for n in set(reader.where) - expected - {"lm_head.weight"} if not _IGNORED.search(n))
    inside = [n for n in extra if n.startswith("model.")]
    if inside:
        raise ValueError(f"{reader.path}: tensors {inside[:4]}{' ...' if len(inside) > 4 else ''} have no place in the "
                         f"model config.json describes (num_hidden_layers={cfg.num_layers}, no biases, dense MLP)")
    if extra:
        warnings.warn(f"{reader.path}: ignoring {len(extra)} tensor(s) a Qwen3ForCausalLM does not use: {extra[:4]}")


def load_hf_checkpoint(path: str, dtype=None, mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES,
                       **config_overrides):
    """Reads `config.json` + safetensors (one file or sharded with an index) -> (cfg, params).

    dtype: parameter dtype (default float32). The compute dtype follows it unless
    `compute_dtype=` is given (training configs use fp32 params + "bfloat16" compute). Other
    keyword overrides go to `Qwen3Config` (e.g. scan_layers, remat_policy). With a mesh each leaf
    is created directly with its target sharding, each device shard read from disk on its own.
    """
    if not os.path.isdir(path):
        if os.path.exists(path):
            raise NotADirectoryError(f"{path} is a file; pass the checkpoint directory (config.json + *.safetensors)")
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    dt = np.dtype(dtype if dtype is not None else np.float32).name
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"dtype={dt}: parameters must be a floating dtype")
    config_overrides.setdefault("param_dtype", dt)
    config_overrides.setdefault("compute_dtype", dt)
    cfg = Qwen3Config.from_hf_json(os.path.join(path, "config.json"), **config_overrides)
    reader = _Reader(path)
    layout = _hf_layout(cfg)
    shapes = param_shapes(cfg)
    shardings = param_shardings(cfg, mesh, rules) if mesh is not None else None
    target_dtype = cfg.jnp_param_dtype
    try:
        _check_tensors(reader, layout, cfg, shapes)
    except BaseException:
        reader.close()
        raise

    def build(path_, leaf):
        key = _path_key(path_)
        template, kind = layout[key]
        stacked = key[0] == "layers"
        shape = leaf.shape
        inner = shape[1:] if stacked else shape

        def block(index) -> np.ndarray:
            idx = [_norm(s, n) for s, n in zip(index, shape)]
            if not stacked:
                out = _read_block(reader.slice(template), kind, idx, cfg, shape)
            else:
                (l0, l1), rest = idx[0], idx[1:]
                out = np.stack([_read_block(reader.slice(template.format(i=i)), kind, rest, cfg, inner)
                                for i in range(l0, l1)])
            return np.ascontiguousarray(out.astype(target_dtype))

        if shardings is None:
            return jax.device_put(block(tuple(slice(None) for _ in shape)))
        sharding = _leaf(shardings, path_)
        return jax.make_array_from_callback(shape, sharding, block)

    try:
        params = jax.tree_util.tree_map_with_path(build, shapes)
    finally:
        reader.close()
    return cfg, params


def _leaf(tree, path):
    for p in path:
        tree = tree[getattr(p, "key", getattr(p, "name", p))]
    return tree


def _to_hf(kind: str, x: np.ndarray) -> np.ndarray:
    if kind == "copy":
        return x
    if kind == "T":
        return x.T
    if kind == "heads_vec":  # [N, D] -> [N*D]
        return x.reshape(-1)
    if kind == "heads_out":  # [E, N, D] -> [N*D, E]
        return x.reshape(x.shape[0], -1).T
    return x.reshape(-1, x.shape[-1]).T  # heads_in: [H, D, E] -> [E, H*D]


def hf_state_dict(cfg: Qwen3Config, params, dtype=None,
                  gather: Callable = jax.device_get) -> dict[str, np.ndarray]:
    """params -> {HF tensor name: numpy array} (one leaf gathered at a time)."""
    out = {}
    for path_, leaf in jax.tree_util.tree_leaves_with_path(params):
        template, kind = _hf_layout(cfg)[_path_key(path_)]
        x = np.asarray(gather(leaf))
        if dtype is not None:
            x = x.astype(dtype)
        if _path_key(path_)[0] == "layers":
            for i in range(cfg.num_layers):
                out[template.format(i=i)] = np.ascontiguousarray(_to_hf(kind, x[i]))
        else:
            out[template] = np.ascontiguousarray(_to_hf(kind, x))
    return out


def _special_ids(cfg: Qwen3Config, hf_cfg: dict, tokenizer) -> dict[str, int]:
    """bos / eos / pad ids for config.json and generation_config.json: the tokenizer's when one
    is given, else the family's defaults; an id outside the vocabulary is dropped (a compact
    tokenizer's model has no id 151645)."""
    ids = {k: hf_cfg.pop(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in hf_cfg}
    if tokenizer is not None:
        for key, tok_id in (("bos_token_id", tokenizer.bos_token_id), ("eos_token_id", tokenizer.eos_token_id),
                            ("pad_token_id", tokenizer.pad_token_id)):
            if tok_id is not None:
                ids[key] = int(tok_id)
    return {k: v for k, v in ids.items() if 0 <= v < cfg.vocab_size}


def save_hf_checkpoint(out_dir: str, cfg: Qwen3Config, params, dtype=None,
                       max_shard_bytes: int = 4 * 1024 ** 3, tokenizer=None) -> list[str]:
    """Writes config.json + safetensors loadable by `transformers` (sharded with an index above
    `max_shard_bytes`) and generation_config.json. dtype: e.g. "bfloat16" to halve the size.
    tokenizer (a transformers tokenizer or a directory holding one): saved alongside, its special
    ids written into the configs, so `AutoTokenizer` / `AutoModelForCausalLM` load the directory
    as is. Returns the weight files written."""
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    if tokenizer is not None and len(tokenizer) > cfg.vocab_size:
        raise ValueError(f"save_hf_checkpoint: the tokenizer has {len(tokenizer)} tokens but the model only "
                         f"{cfg.vocab_size} embeddings; pass the tokenizer the model was trained with")
    os.makedirs(out_dir, exist_ok=True)
    np_dtype = None if dtype is None else np.dtype(dtype)
    tensors = hf_state_dict(cfg, params, np_dtype)
    hf_cfg = cfg.to_hf_dict()
    hf_cfg["torch_dtype"] = (np_dtype or cfg.jnp_param_dtype).name
    hf_cfg["dtype"] = hf_cfg["torch_dtype"]
    special = _special_ids(cfg, hf_cfg, tokenizer)
    hf_cfg.update(special)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(special, f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    shards, cur, size = [], {}, 0
    for name, arr in tensors.items():
        if cur and size + arr.nbytes > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = arr
        size += arr.nbytes
    shards.append(cur)
    files = []
    if len(shards) == 1:
        fn = os.path.join(out_dir, "model.safetensors")
        save_file(shards[0], fn, metadata={"format": "pt"})
        return [fn]
    weight_map = {}
    for i, shard in enumerate(shards):
        base = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out_dir, base), metadata={"format": "pt"})
        weight_map.update({k: base for k in shard})
        files.append(os.path.join(out_dir, base))
    total = sum(a.nbytes for a in tensors.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return files
