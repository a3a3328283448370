"""Training objectives for `make_train_step`: SFT, GRPO (PPO-clip + KL) and DPO.

Each objective is a frozen (hashable) dataclass with
  counts(batch) -> dict          global denominators, computed once over the whole batch
  loss(params, micro, counts)    -> (scalar, metrics); values are per-micro-batch contributions
                                 that sum to the whole-batch value.
Batches are dicts of arrays with a leading batch axis; all masks are aligned with `tokens`
(see `models.token_logprobs`: position t scores tokens[t] given tokens[:t]). `counts` checks the
batch's keys and shapes first (ValueError naming the key), since `make_train_step` calls it once
on the whole batch before splitting it.

Every objective carries the `mesh` and `rules` its model runs under: without them the model's
sharding constraints are no-ops and XLA is free to replicate the batch on every chip (no FSDP at
all). `make_train_step` binds the train state's mesh (`on_mesh`) when the objective has none.

SFT and GRPO (with a policy loss registered ``per_token=True`` and a linear aggregation mode) are
sums of per-token terms: with ``fused_head`` (default) the output head's gradient is taken chunk by
chunk in the forward pass (`models.token_loss_and_logprobs`, 3 output projections per token instead
of 4); ``fused_head=False`` keeps the rematerialised path, which gives the same gradients.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.functional import token_logprobs, token_loss_and_logprobs
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules
from reagent_jax.rl.aggregation import AGG_MODES, aggregate_loss, loss_counts, masked_mean, token_weights
from reagent_jax.rl.dpo import dpo_loss
from reagent_jax.rl.kl import kl_penalty
from reagent_jax.rl.policy_loss import POLICY_LOSSES
from reagent_jax.rl.stage_config import GRPOConfig


_Dims = tuple  # dimension names (str, bound by the first array that has them) or fixed ints


def _check_batch(objective: str, batch, spec: dict[str, list[_Dims]], optional: tuple[str, ...] = ()) -> None:
    """ValueError naming the key when a batch array is missing or disagrees with the others.

    Shapes are static, so this runs once at trace time. Without it a [1, T] or [B, 1] loss_mask
    broadcasts silently, and a [P, 1] ref_logps is read out of bounds (JAX clamps the index).
    """
    needed = [k for k in spec if k not in optional]
    missing = [k for k in needed if k not in batch]
    if missing:
        raise ValueError(f"{objective} batch lacks {missing}; it needs {needed}, got {sorted(batch)}")
    dims: dict[str, int] = {}
    for key, templates in spec.items():
        if key not in batch:
            continue
        shape = tuple(jnp.shape(batch[key]))
        for tpl in templates:
            fits = len(tpl) == len(shape) and all(
                n == (d if isinstance(d, int) else dims.get(d, n)) for d, n in zip(tpl, shape))
            if fits:
                dims.update((d, n) for d, n in zip(tpl, shape) if isinstance(d, str))
                break
        else:
            want = " or ".join("[" + ", ".join(map(str, tpl)) + "]" for tpl in templates)
            known = ", ".join(f"{d}={n}" for d, n in dims.items())
            raise ValueError(f"{objective} batch[{key!r}] has shape {list(shape)}, expected {want}"
                             + (f" with {known}" if known else ""))


def on_mesh(objective, mesh: Optional[Mesh], rules: Optional[Rules] = None):
    """The objective with `mesh` (and `rules`) bound; ValueError if it is already bound to another mesh."""
    current = getattr(objective, "mesh", mesh)  # an objective without a mesh field is left as it is
    if mesh is None or current is mesh:
        return objective
    if current is not None and current != mesh:
        raise ValueError(f"{type(objective).__name__} runs on mesh {dict(current.shape)} but the train state "
                         f"lives on mesh {dict(mesh.shape)}; build both from the same mesh")
    return dataclasses.replace(objective, mesh=mesh, rules=objective.rules if rules is None else rules)


def _weighted(local_mean, local_count, global_count):
    """A micro-batch mean re-weighted so that summing over micro-batches gives the global mean."""
    return local_mean * local_count / jnp.maximum(global_count, 1.0)


@dataclasses.dataclass(frozen=True)
class SFTObjective:
    """Next-token NLL on loss-masked tokens (assistant turns only), token-mean over the batch.

    `context_weight` > 0 adds that weight times the NLL of the other real tokens (system, user,
    tool responses), token-mean over those. Why: a randomly initialised model (the CPU
    quickstart) has no copying circuits yet, and tool responses are full of the names and numbers
    the agent must copy, so modelling them teaches copying several times faster. A pretrained
    checkpoint already copies; keep 0 there (plain agent SFT).

    batch: tokens [B, T], attention_mask [B, T], loss_mask [B, T], optionally context_mask [B, T]
    (which of the other tokens count as context; `chat.render` leaves weight-0 assistant turns out).
    """
    cfg: Qwen3Config
    chunk_size: int = 256
    context_weight: float = 0.0
    fused_head: bool = True
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    def counts(self, batch):
        _check_batch("SFT", batch, {k: [("B", "T")] for k in ("tokens", "attention_mask", "loss_mask", "context_mask")},
                     optional=("context_mask",))
        c = {"num_tokens": jnp.sum(batch["loss_mask"].astype(jnp.float32))}
        if self.context_weight:
            c["num_context"] = jnp.sum(self._context_mask(batch))
        return c

    @staticmethod
    def _context_mask(batch):
        """Real, non-assistant tokens; the first token of a row has no prediction, so never context."""
        m = jnp.asarray(batch["attention_mask"], jnp.float32) * (1.0 - jnp.asarray(batch["loss_mask"], jnp.float32))
        if "context_mask" in batch:
            m = m * jnp.asarray(batch["context_mask"], jnp.float32)
        return m.at[:, 0].set(0.0)

    def loss(self, params, mb, counts):
        mask = mb["loss_mask"].astype(jnp.float32)
        ctx = self._context_mask(mb) if self.context_weight else None
        head = dict(chunk_size=self.chunk_size, mesh=self.mesh, rules=self.rules)
        total = None
        if self.fused_head:
            weights = mask / jnp.maximum(counts["num_tokens"], 1.0)  # [B, T]: the loss is -sum(weights * lp)
            if ctx is not None:
                weights = weights + self.context_weight * ctx / jnp.maximum(counts["num_context"], 1.0)
            total, lp, _ = token_loss_and_logprobs(self.cfg, params, mb["tokens"], mb["attention_mask"],
                                                   lambda lp, ent, w: -jnp.sum(w * lp), weights, **head)
        else:
            lp = token_logprobs(self.cfg, params, mb["tokens"], mb["attention_mask"], **head)
        nll = -jnp.sum(lp * mask) / jnp.maximum(counts["num_tokens"], 1.0)
        metrics = {"sft/nll": nll, "sft/num_tokens": jnp.sum(mask)}
        if ctx is None:
            return nll if total is None else total, metrics
        ctx_nll = -jnp.sum(lp * ctx) / jnp.maximum(counts["num_context"], 1.0)
        metrics["sft/context_nll"] = ctx_nll
        return nll + self.context_weight * ctx_nll if total is None else total, metrics


@dataclasses.dataclass(frozen=True)
class GRPOObjective:
    """Clipped policy gradient (clip-higher, dual clip) + beta * KL(policy || ref), aggregated with
    global counts.

    batch: tokens, attention_mask, loss_mask, old_logprobs [B, T]; advantages [B] or [B, T];
    ref_logprobs [B, T] when beta != 0. `temperature` must be the sampling temperature so the
    logprobs here use the rollout engine's definition. `policy_loss` names an entry of
    `rl.POLICY_LOSSES` ("vanilla" PPO clip, "gspo", "cispo", or one registered by the user).
    """
    cfg: Qwen3Config
    policy_loss: str = "vanilla"
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip_c: float = 3.0
    beta: float = 0.0
    kl_kind: str = "k3"
    loss_agg_mode: str = "token-mean"
    temperature: float = 1.0
    entropy_coef: float = 0.0
    chunk_size: int = 256
    fused_head: bool = True
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    def counts(self, batch):
        spec = {k: [("B", "T")] for k in ("tokens", "attention_mask", "loss_mask", "old_logprobs", "ref_logprobs")}
        spec["advantages"] = [("B",), ("B", "T")]
        _check_batch("GRPO", batch, spec, optional=() if self.beta else ("ref_logprobs",))
        c = loss_counts(batch["loss_mask"])
        return {"num_tokens": c.num_tokens, "num_seqs": c.num_seqs}

    @property
    def fuses_head(self) -> bool:
        """Whether the head's gradient is taken in the forward pass: the loss must be per-token."""
        return (self.fused_head and bool(POLICY_LOSSES.traits(self.policy_loss).get("per_token"))
                and bool(AGG_MODES.traits(self.loss_agg_mode).get("linear")))

    def _token_terms(self, lp, ent, old_logprobs, advantages, ref_logprobs, mask):
        """(per-token loss [B, T], the policy loss's output, per-token KL or None) of [B, T] inputs
        (or [B, C] chunks of them)."""
        pg = POLICY_LOSSES.get(self.policy_loss)(lp, old_logprobs, advantages, mask, eps_low=self.eps_low,
                                                 eps_high=self.eps_high, dual_clip_c=self.dual_clip_c)
        loss, kl = pg.token_loss, None
        if self.beta:
            kl = kl_penalty(lp, ref_logprobs, self.kl_kind)
            loss = loss + self.beta * kl
        if self.entropy_coef:
            loss = loss - self.entropy_coef * ent
        return loss, pg, kl

    def loss(self, params, mb, counts):
        mask = mb["loss_mask"].astype(jnp.float32)
        agg_counts = dict(global_num_tokens=counts["num_tokens"], global_num_seqs=counts["num_seqs"])
        agg = lambda x: aggregate_loss(x, mask, self.loss_agg_mode, **agg_counts)
        adv = jnp.asarray(mb["advantages"], jnp.float32)
        adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, mask.shape)  # [B, T]
        ref = mb["ref_logprobs"] if self.beta else None
        head = dict(temperature=self.temperature, chunk_size=self.chunk_size, mesh=self.mesh, rules=self.rules,
                    return_entropy=True)
        total = None
        if self.fuses_head:
            aux = {"old": mb["old_logprobs"], "adv": adv, "ref": ref, "mask": mask,
                   "weight": token_weights(mask, self.loss_agg_mode, **agg_counts)}

            def token_loss(lp, ent, a):
                terms = self._token_terms(lp, ent, a["old"], a["adv"], a["ref"], a["mask"])[0]
                return jnp.sum(jnp.where(a["mask"] > 0, a["weight"] * terms, 0.0))

            total, lp, ent = token_loss_and_logprobs(self.cfg, params, mb["tokens"], mb["attention_mask"],
                                                     token_loss, aux, **head)
        else:
            lp, ent = token_logprobs(self.cfg, params, mb["tokens"], mb["attention_mask"], **head)
        _, pg, kl = self._token_terms(lp, ent, mb["old_logprobs"], adv, ref, mask)
        pg_loss = agg(pg.token_loss)
        local_tokens = jnp.sum(mask)
        w = lambda m: _weighted(m, local_tokens, counts["num_tokens"])
        metrics = {"actor/pg_loss": pg_loss, "actor/entropy": w(masked_mean(ent, mask)),
                   "actor/pg_clipfrac": w(pg.metrics["pg_clipfrac"]),
                   "actor/pg_clipfrac_lower": w(pg.metrics["pg_clipfrac_lower"]),
                   "actor/ppo_kl": w(pg.metrics["ppo_kl"])}
        if self.beta:
            metrics["actor/kl_loss"] = agg(kl)
        if total is None:
            total = pg_loss + (self.beta * metrics["actor/kl_loss"] if self.beta else 0.0)
            total = total - (self.entropy_coef * agg(ent) if self.entropy_coef else 0.0)
        return total, metrics


def grpo_objective(cfg: Qwen3Config, block: GRPOConfig, temperature: float = 1.0) -> GRPOObjective:
    """The GRPOObjective a GRPO block names (a GRPOConfig, or a config's grpo block read as one)."""
    g = GRPOConfig.from_config(block, "grpo")
    return GRPOObjective(cfg, policy_loss=g.policy_loss, eps_low=g.eps_low, eps_high=g.eps_high,
                         dual_clip_c=g.dual_clip_c, beta=g.beta, kl_kind=g.kl_kind, loss_agg_mode=g.loss_agg_mode,
                         temperature=temperature, fused_head=g.fused_head)


def sequence_logps(cfg: Qwen3Config, params, tokens, attention_mask, loss_mask, chunk_size: int = 256,
                   mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES):
    """Sum of token logprobs over loss-masked tokens per row: [B, T] inputs -> [B]."""
    lp = token_logprobs(cfg, params, tokens, attention_mask, chunk_size=chunk_size, mesh=mesh, rules=rules)
    return jnp.sum(lp * loss_mask.astype(jnp.float32), axis=-1)


@dataclasses.dataclass(frozen=True)
class DPOObjective:
    """DPO-family loss on (chosen, rejected) pairs packed together in one forward pass.

    batch: tokens, attention_mask, loss_mask [P, 2, T] (index 0 = chosen, 1 = rejected; loss_mask
    marks the judged completion); ref_logps [P, 2] (precomputed with the frozen reference, which
    then never needs to be in memory during the update); pair_mask [P] (optional, padding pairs 0).
    """
    cfg: Qwen3Config
    loss_type: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    nll_coef: float = 0.0
    chunk_size: int = 256
    mesh: Optional[Mesh] = None
    rules: Rules = DEFAULT_RULES

    def counts(self, batch):
        spec = {k: [("P", 2, "T")] for k in ("tokens", "attention_mask", "loss_mask")}
        spec.update(ref_logps=[("P", 2)], pair_mask=[("P",)])
        _check_batch("DPO", batch, spec, optional=("pair_mask",))
        pm = batch.get("pair_mask", jnp.ones(batch["tokens"].shape[:1]))
        return {"num_pairs": jnp.sum(pm.astype(jnp.float32))}

    def loss(self, params, mb, counts):
        p, _, t = mb["tokens"].shape
        flat = lambda x: x.reshape(2 * p, t)
        logps = sequence_logps(self.cfg, params, flat(mb["tokens"]), flat(mb["attention_mask"]),
                               flat(mb["loss_mask"]), self.chunk_size, self.mesh, self.rules).reshape(p, 2)
        lengths = jnp.sum(mb["loss_mask"].astype(jnp.float32), axis=-1)  # [P, 2]
        pm = mb.get("pair_mask", jnp.ones((p,)))
        out = dpo_loss(logps[:, 0], logps[:, 1], mb["ref_logps"][:, 0], mb["ref_logps"][:, 1],
                       loss_type=self.loss_type, beta=self.beta, label_smoothing=self.label_smoothing,
                       chosen_lengths=lengths[:, 0], rejected_lengths=lengths[:, 1], pair_mask=pm.astype(bool),
                       global_num_pairs=counts["num_pairs"])
        local = jnp.sum(pm.astype(jnp.float32))
        metrics = {k: _weighted(v, local, counts["num_pairs"]) for k, v in out.metrics.items()}
        nll = _weighted(out.chosen_nll, local, counts["num_pairs"])
        metrics["dpo/loss"] = out.loss
        metrics["dpo/chosen_nll"] = nll
        return out.loss + self.nll_coef * nll, metrics
