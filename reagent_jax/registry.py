"""One registry pattern for every named building block (verl's ``register_policy_loss`` /
``register_adv_est``, Tunix's function registry).

Each kind of block (advantage estimators, policy losses, KL estimators, loss aggregation modes,
DPO losses in `rl`; reward functions in `rewards`; Reagent strategies in `rrm.strategies`;
Agent-RRM judges in `pipelines.agent`) has one ``Registry``: configs name an entry, the trainer looks it up, and the config
check lists the registry itself, so a block registered by a user's own module is accepted
everywhere at once::

    from reagent_jax.rl import POLICY_LOSSES

    @POLICY_LOSSES.register("my_loss")
    def my_loss(logprobs, old_logprobs, advantages, loss_mask, **clip): ...

A registry is a read-only ``Mapping`` from every name (aliases included) to its entry; ``get``
raises a ValueError listing the known names. An entry may declare traits the trainer can rely on,
``register("name", per_token=True)``, read back with ``traits(name)`` (empty when none were
declared: an undeclared property is never assumed).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Mapping, Generic[F]):
    """Named entries of one kind (`kind` names it in errors, e.g. "policy loss")."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, F] = {}
        self._canonical: dict[str, str] = {}
        self._traits: dict[str, dict[str, object]] = {}

    def register(self, name: str, *aliases: str, **traits: object) -> Callable[[F], F]:
        """Decorator registering `fn` under `name` (and `aliases`) with optional `traits`; a name
        taken by another entry is an error, re-registering the same function is not."""
        def decorator(fn: F) -> F:
            for key in (name, *aliases):
                if key in self._entries and self._entries[key] is not fn:
                    raise ValueError(f"{self.kind} {key!r} is already registered as {self._entries[key]}")
            for key in (name, *aliases):
                self._entries[key] = fn
                self._canonical[key] = name
            if traits or name not in self._traits:  # registering the same function again keeps its traits
                self._traits[name] = dict(traits)
            return fn
        return decorator

    def get(self, name: str) -> F:  # type: ignore[override]  (raises instead of returning None)
        """The entry registered as `name`; ValueError listing the known names otherwise."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {sorted(self._entries)}") from None

    def canonical(self, name: str) -> str:
        """The name an alias stands for (the name itself for a primary name)."""
        self.get(name)
        return self._canonical[name]

    def traits(self, name: str) -> Mapping[str, object]:
        """The traits `name`'s entry was registered with (a copy; {} when none)."""
        return dict(self._traits.get(self.canonical(name), {}))

    def __getitem__(self, name: str) -> F:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {sorted(self._entries)})"
