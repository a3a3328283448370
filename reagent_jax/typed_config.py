"""Typed config blocks: an ml_collections block becomes a frozen dataclass once, where a run starts.

Launch scripts keep ml_collections (absl `--config.grpo.steps=4` overrides, notebooks editing a
ConfigDict); the code that trains reads frozen dataclasses instead, so a field is a typed attribute
with one default in one place, not a `block.get("key", default)` repeated wherever it is read.
Each block class validates itself: wrong types, unknown keys (a misspelt override) and values out
of range are reported together, each as `config.<block>.<field>=<value>: why`.

    @dataclasses.dataclass(frozen=True)
    class CheckpointConfig(Block):
        every: int = 50
        keep: int = 2

        def problems(self):
            return at_least(self, every=1, keep=1)

    CheckpointConfig.from_config(config.checkpoint, "checkpoint")  # -> CheckpointConfig(every=50, keep=2)
"""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

B = TypeVar("B", bound="Block")
Problem = tuple[str, str]  # (field, why)


class ConfigError(ValueError):
    """One or more config fields are invalid; the message lists each as `config.<key>=...: why`."""


def format_problem(key: str, value: Any, why: str) -> str:
    return f"config.{key}={value!r}: {why}"


class Block:
    """Mixin for a frozen dataclass holding one config block; see the module docstring."""

    def problems(self) -> list[Problem]:
        """Value checks beyond the field types: (field, why) for each invalid field."""
        return []

    def __post_init__(self) -> None:
        found = _type_problems(self) or self.problems()  # value checks need the right types
        lines = [f"{type(self).__name__}.{k}={getattr(self, k, None)!r}: {why}" for k, why in found]
        if lines:
            raise ConfigError(f"{len(lines)} invalid field(s):\n  " + "\n  ".join(lines))

    @classmethod
    def from_config(cls: type[B], block: Any, name: str) -> B:
        """`block` (a ConfigDict, a mapping or already a `cls`) as a `cls`; ConfigError naming every
        invalid field of `config.<name>` otherwise. Missing keys take the field's default."""
        if isinstance(block, cls):
            return block
        lines = problems_of(cls, block, name)
        if lines:
            raise ConfigError(f"config.{name}: {len(lines)} invalid field(s):\n  " + "\n  ".join(lines))
        return cls(**_values(cls, block, name)[0])


def problems_of(cls: type[Block], block: Any, name: str) -> list[str]:
    """Every problem of `block` read as `cls`, as `config.<name>.<field>=<value>: why` lines (a
    config check collects these across blocks before raising)."""
    if isinstance(block, cls):
        return []
    if not isinstance(block, Mapping) and not hasattr(block, "keys"):
        return [format_problem(name, block, f"expected a block of fields ({', '.join(_names(cls))})")]
    values, lines = _values(cls, block, name)
    known = set(_names(cls))
    for key in block.keys():
        if key not in known:
            lines.append(format_problem(f"{name}.{key}", block[key], f"unknown field; {cls.__name__} has "
                                                                     f"{', '.join(sorted(known))}"))
    typed = _type_problems_of(cls, values)
    bad = {k for k, _ in typed}
    lines += [format_problem(f"{name}.{k}", values[k], why) for k, why in typed]
    # value checks on the fields whose types are right (defaults stand in for the others)
    probe = object.__new__(cls)
    for f in dataclasses.fields(cls):
        default = _default(f)
        value = values.get(f.name, default) if f.name not in bad else default
        object.__setattr__(probe, f.name, value)
    try:
        checks = probe.problems()
    except (TypeError, ValueError, AttributeError):  # a check tripped over a field that is missing
        checks = []
    lines += [format_problem(f"{name}.{k}", getattr(probe, k, None), why) for k, why in checks if k not in bad]
    return lines


def at_least(block: Block, **minimums: float) -> list[Problem]:
    """(field, "must be >= m") for each field below its minimum (NaN included)."""
    return [(k, f"must be >= {m}") for k, m in minimums.items()
            if isinstance(getattr(block, k), (int, float)) and not getattr(block, k) >= m]  # NaN fails too


def one_of(block: Block, field: str, allowed: Sequence[str]) -> list[Problem]:
    """(field, "use one of ...") when the field's value is not in `allowed` (a list or a registry)."""
    return [] if getattr(block, field) in allowed else [(field, f"use one of {', '.join(map(str, allowed))}")]


def in_range(block: Block, field: str, low: float, high: float, low_open: bool = False) -> list[Problem]:
    v = getattr(block, field)
    if not isinstance(v, (int, float)):
        return []  # a wrong type is reported on its own
    ok = (low < v if low_open else low <= v) and v <= high
    return [] if ok else [(field, f"must be in {'(' if low_open else '['}{low}, {high}]")]


# ---- field types ---------------------------------------------------------------------------------
def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _values(cls, block, name: str) -> tuple[dict, list[str]]:
    """The block's values for `cls`'s fields, ints widened to floats and lists made tuples where
    the field asks for it; a required field that is missing is a problem."""
    hints, values, lines = typing.get_type_hints(cls), {}, []
    for f in dataclasses.fields(cls):
        if f.name in block.keys():
            values[f.name] = _coerce(hints[f.name], block[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            lines.append(format_problem(f"{name}.{f.name}", "<unset>", "required"))
    return values, lines


def _coerce(hint, value):
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for h in typing.get_args(hint):
            if _matches(h, _coerce(h, value)):
                return _coerce(h, value)
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typing.get_origin(hint) is tuple and isinstance(value, (list, tuple)):
        return tuple(value)
    return value


def _matches(hint, value) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(h, value) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(args[0], v) for v in value)
        return len(args) == len(value) and all(_matches(h, v) for h, v in zip(args, value))
    if hint is float:
        return isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool))
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint) -> str:
    if typing.get_args(hint):  # tuple[int, ...], Optional[str], Union[str, tuple[int, ...]]
        return str(hint).replace("typing.", "")
    return getattr(hint, "__name__", str(hint))


def _type_problems_of(cls, values: dict) -> list[Problem]:
    hints = typing.get_type_hints(cls)
    return [(k, f"expected {_type_name(hints[k])}") for k, v in values.items() if not _matches(hints[k], v)]


def _type_problems(block: Block) -> list[Problem]:
    return _type_problems_of(type(block), {f.name: getattr(block, f.name) for f in dataclasses.fields(block)})
