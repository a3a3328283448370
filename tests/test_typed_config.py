"""typed_config: a config block read as a frozen dataclass names every bad field at once."""
import dataclasses
from typing import Optional

import ml_collections
import pytest

from reagent_jax.typed_config import Block, ConfigError, at_least, in_range, one_of, problems_of


@dataclasses.dataclass(frozen=True)
class Toy(Block):
    steps: int
    rate: float = 0.5
    name: str = "a"
    sizes: tuple[int, ...] = ()
    note: Optional[str] = None
    flag: bool = False

    def problems(self):
        return at_least(self, steps=1) + in_range(self, "rate", 0.0, 1.0) + one_of(self, "name", ("a", "b"))


def test_a_block_becomes_the_dataclass_with_defaults_and_widened_types():
    got = Toy.from_config(ml_collections.ConfigDict(dict(steps=3, rate=1, sizes=[1, 2])), "toy")
    assert got == Toy(steps=3, rate=1.0, sizes=(1, 2))
    assert isinstance(got.rate, float) and isinstance(got.sizes, tuple)
    assert Toy.from_config(got, "toy") is got  # already typed: passed through
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.steps = 4


def test_every_problem_of_a_block_is_named_together():
    block = dict(steps=0, rate=2.0, name="c", flag=1, sizes=("x",), stepz=3)
    with pytest.raises(ConfigError) as e:
        Toy.from_config(block, "toy")
    text = str(e.value)
    for want in ("config.toy.steps=0: must be >= 1", "config.toy.rate=2.0: must be in [0.0, 1.0]",
                 "config.toy.name='c': use one of a, b", "config.toy.flag=1: expected bool",
                 "config.toy.sizes=('x',): expected tuple[int, ...]", "config.toy.stepz=3: unknown field; Toy has"):
        assert want in text, (want, text)
    assert text.startswith("config.toy: 6 invalid field(s)")


def test_a_wrong_type_does_not_hide_the_value_checks_of_other_fields():
    lines = problems_of(Toy, dict(steps=True, name="z"), "toy")  # bool is not an int; steps has no default
    assert lines == ["config.toy.steps=True: expected int", "config.toy.name='z': use one of a, b"]


def test_missing_required_field_and_a_non_block_are_errors():
    assert problems_of(Toy, {}, "toy") == ["config.toy.steps='<unset>': required"]
    assert "expected a block of fields" in problems_of(Toy, 3, "toy")[0]


def test_direct_construction_validates_too():
    with pytest.raises(ConfigError, match=r"Toy.rate=nan: must be in"):
        Toy(steps=1, rate=float("nan"))
    with pytest.raises(ConfigError, match=r"Toy.note=3: expected Optional\[str\]"):
        Toy(steps=1, note=3)
    assert Toy(steps=1, note="x").note == "x"
