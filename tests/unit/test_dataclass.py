"""installer.base.dataclass against the standard library's dataclass, class by class.

Each shape below is written once and decorated twice, by ``dataclasses.dataclass`` and by
ours; every test then does the same thing to both and asserts the same result: the
arguments ``__init__`` takes and the errors it raises (their wording too, past the
function's name), ``repr``, ``==``, ``hash``, assignment to a frozen record, ``replace``,
``asdict``, ``fields``, ``__match_args__``, copying and ``__post_init__``.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
from dataclasses import FrozenInstanceError, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from installer.base import dataclass as ours_module
from installer.base.dataclass import dataclass as ours

COVERED = sys.version_info < (3, 13)  # later, ours is the standard library's


def _shapes(deco: Any) -> dict[str, type]:
    """The record shapes the installer writes, each decorated with ``deco``."""

    @deco(frozen=True)
    class Plain:
        name: str
        size: int

    @deco(frozen=True)
    class Defaults:
        """A record with a docstring of its own."""
        version: str
        tags: tuple[str, ...] = ()
        extra: list[str] = field(default_factory=list)
        note: str | None = None

    @deco(frozen=True)
    class Shaped:
        key: str
        hidden: str = field(default="x", repr=False)
        ignored: int = field(default=0, compare=False)
        unhashed: int = field(default=0, hash=False)
        later: int = field(default=7, init=False)
        made: tuple[str, ...] = field(default_factory=tuple, init=False)
        KIND: ClassVar[str] = "shaped"

    @deco(frozen=True)
    class Checked:
        low: int
        high: int

        def __post_init__(self) -> None:
            if self.low > self.high:
                raise ValueError(f"low {self.low} above high {self.high}")

    @deco(frozen=True)
    class Empty:
        pass

    @deco(frozen=True)
    class One:
        value: float

    @deco
    class Mutable:
        steps: list[str] = field(default_factory=list)
        count: int = 0

    @deco()
    class MutablePost:
        first: str
        derived: str = field(init=False)

        def __post_init__(self) -> None:
            self.derived = self.first.upper()

    class Base:
        def describe(self) -> str:
            return f"<{type(self).__name__}>"

    @deco(frozen=True)
    class Derived(Base):
        detail: str = "d"

    @deco(frozen=True)
    class Child(Plain):  # a dataclass base: ours hands it to the standard library
        extra: int = 1

    return {name: cls for name, cls in locals().items() if isinstance(cls, type)
            and name not in ("Base", "deco")}


STANDARD = _shapes(dataclasses.dataclass)
OURS = _shapes(ours)
NAMES = sorted(STANDARD)

# Per shape: calls to try, as (args, kwargs): good ones and every kind of bad one.
CALLS: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {
    "Plain": [(("a", 1), {}), (("a",), {"size": 2}), ((), {"name": "a", "size": 3}),
              (("a",), {}), ((), {}), (("a", 1, 2), {}), (("a", 1), {"name": "b"}),
              (("a", 1), {"colour": 1}), ((), {"size": 1})],
    "Defaults": [(("1.0",), {}), (("1.0", ("t",), ["e"], "n"), {}), ((), {"version": "2"}),
                 ((), {}), (("1", (), [], None, 5), {}), (("1",), {"extra": ["x"], "bogus": 1})],
    "Shaped": [(("k",), {}), (("k", "h", 1, 2), {}), (("k",), {"later": 1}),
               (("k",), {"unset": 1}), ((), {})],
    "Checked": [((1, 2), {}), ((3, 2), {}), ((1,), {})],
    "Empty": [((), {}), ((1,), {}), ((), {"x": 1})],
    "One": [((1.5,), {}), ((float("nan"),), {}), ((), {})],
    "Mutable": [((), {}), ((["a"], 2), {}), ((["a"], 2, 3), {})],
    "MutablePost": [(("abc",), {}), (("abc",), {"derived": "x"})],
    "Derived": [((), {}), (("e",), {})],
    "Child": [(("a", 1), {}), (("a", 1, 2), {}), (("a",), {})],
}


def _outcome(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
    """What calling the class did: its state, or the error's type and wording after the
    function's name (the standard library's says ``__create_fn__.<locals>.__init__()``)."""
    try:
        made = cls(*args, **kwargs)
    except (TypeError, ValueError) as error:
        return type(error).__name__, str(error).split("() ", 1)[-1]
    return "made", (repr(made), vars(made))


@pytest.mark.parametrize("name", NAMES)
def test_init_takes_and_refuses_the_same_arguments_with_the_same_words(name):
    for args, kwargs in CALLS[name]:
        assert _outcome(OURS[name], args, kwargs) == _outcome(STANDARD[name], args, kwargs), \
            (name, args, kwargs)


def _pairs(name: str) -> list[tuple[Any, Any]]:
    """Instances of both classes made from every good call of the shape."""
    made = []
    for args, kwargs in CALLS[name]:
        try:
            made.append((STANDARD[name](*args, **kwargs), OURS[name](*args, **kwargs)))
        except (TypeError, ValueError):
            continue
    assert made, name
    return made


@pytest.mark.parametrize("name", NAMES)
def test_repr_eq_and_hash_match(name):
    pairs = _pairs(name)
    for standard, mine in pairs:
        assert repr(mine).replace("_shapes.<locals>.", "") == \
            repr(standard).replace("_shapes.<locals>.", "")
        frozen = STANDARD[name].__dataclass_params__.frozen
        if frozen:  # same field tuples, same hash, or the same refusal (a list inside)
            assert _hashed(mine) == _hashed(standard)
        else:
            with pytest.raises(TypeError, match="unhashable"):
                hash(mine)
    for first_standard, first_mine in pairs:
        for second_standard, second_mine in pairs:
            assert (first_mine == second_mine) == (first_standard == second_standard)
            assert (first_mine != second_mine) == (first_standard != second_standard)
    standard, mine = pairs[0]
    assert mine != standard  # another class, even with the same fields
    assert mine.__eq__(object()) is NotImplemented


def _hashed(record: Any) -> int | str:
    try:
        return hash(record)
    except TypeError as error:
        return str(error)


def test_the_same_nan_equals_itself_as_in_a_tuple():
    nan = float("nan")
    assert OURS["One"](nan) == OURS["One"](nan)
    assert STANDARD["One"](nan) == STANDARD["One"](nan)
    assert OURS["One"](nan) != OURS["One"](float("nan"))


def test_compare_and_hash_options_pick_the_fields():
    shaped = OURS["Shaped"]
    assert shaped("k", ignored=1) == shaped("k", ignored=2)
    assert shaped("k", unhashed=1) != shaped("k", unhashed=2)
    assert hash(shaped("k", unhashed=1)) == hash(shaped("k", unhashed=2))
    assert "hidden" not in repr(shaped("k"))


@pytest.mark.parametrize("name", NAMES)
def test_a_frozen_record_refuses_assignment_and_deletion(name):
    for standard, mine in _pairs(name):
        if not STANDARD[name].__dataclass_params__.frozen:
            mine.extra_attribute = 1
            continue
        for target in (standard, mine):
            with pytest.raises(FrozenInstanceError, match="cannot assign to field 'anything'"):
                target.anything = 1
            for existing in vars(target):
                with pytest.raises(FrozenInstanceError, match=f"cannot delete field '{existing}'"):
                    delattr(target, existing)


@pytest.mark.parametrize("name", NAMES)
def test_the_dataclasses_module_reads_ours_as_its_own(name):
    standard_cls, mine_cls = STANDARD[name], OURS[name]
    assert dataclasses.is_dataclass(mine_cls)
    assert [f.name for f in dataclasses.fields(mine_cls)] == \
        [f.name for f in dataclasses.fields(standard_cls)]
    assert getattr(mine_cls, "__match_args__", None) == getattr(standard_cls, "__match_args__", None)
    assert mine_cls.__dataclass_params__.frozen == standard_cls.__dataclass_params__.frozen
    for standard, mine in _pairs(name):
        assert dataclasses.asdict(mine) == dataclasses.asdict(standard)
        assert vars(copy.deepcopy(mine)) == vars(mine)  # the __reduce_ex__ pickle uses
        replaced_fields = {f.name: getattr(mine, f.name) for f in dataclasses.fields(mine)
                           if f.init}
        assert dataclasses.replace(mine, **replaced_fields) == mine


def test_replace_runs_post_init_and_refuses_init_false_fields():
    checked = OURS["Checked"](1, 2)
    with pytest.raises(ValueError, match="low 5 above high 2"):
        dataclasses.replace(checked, low=5)
    with pytest.raises(ValueError, match="init=False"):
        dataclasses.replace(OURS["Shaped"]("k"), later=1)
    assert OURS["MutablePost"]("ab").derived == "AB"


def test_a_factory_runs_per_instance():
    first, second = OURS["Mutable"](), OURS["Mutable"]()
    first.steps.append("x")
    assert second.steps == []


def test_pattern_matching_reads_the_positional_fields():
    plain = OURS["Plain"]
    match plain("a", 1):
        case plain(name, size):
            assert (name, size) == ("a", 1)
        case _:
            pytest.fail("no match")


@pytest.mark.skipif(not COVERED, reason="Python 3.13 and later: the standard library's own")
def test_covered_classes_run_no_generated_code_and_the_rest_do():
    assert OURS["Plain"].__init__.__code__.co_filename == ours_module.__file__
    assert OURS["Plain"].__init__.__qualname__.endswith("Plain.__init__")
    # A dataclass base goes to the standard library: its __init__ is compiled from text.
    assert OURS["Child"].__init__.__code__.co_filename != ours_module.__file__


def test_a_non_default_field_after_a_default_one_is_refused_at_the_class():
    for deco in (dataclasses.dataclass, ours):
        with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
            @deco(frozen=True)
            class Wrong:
                a: int = 1
                b: int


def test_a_mutable_default_is_refused_as_the_standard_library_refuses_it():
    for deco in (dataclasses.dataclass, ours):
        with pytest.raises(ValueError, match="mutable default"):
            @deco
            class Wrong:
                items: list[str] = []  # noqa: RUF012 - the refusal is the test


def test_other_options_and_shapes_go_to_the_standard_library():
    @ours(order=True, frozen=True)
    class Ordered:
        n: int

    assert Ordered(1) < Ordered(2)

    @ours(frozen=True)
    class OwnRepr:
        n: int

        def __repr__(self) -> str:
            return "own"

    assert repr(OwnRepr(1)) == "own"
    assert OwnRepr(1) == OwnRepr(1)

    @ours
    class KeywordOnly:
        a: int
        b: int = field(kw_only=True, default=2)

    assert KeywordOnly(1, b=3).b == 3
    with pytest.raises(TypeError):
        KeywordOnly(1, 3)


def test_every_record_of_the_installer_is_declared_with_ours():
    """A record declared with the standard library's decorator compiles its methods at
    import again (five or six ``exec``s, ~0.5 ms a class on a cache hit's start-up)."""
    root = Path(ours_module.__file__).resolve().parents[1]
    standard = re.compile(r"^from dataclasses import [^\n]*\bdataclass\b|@dataclasses\.dataclass",
                          re.M)
    found = [str(path.relative_to(root.parent)) for path in sorted(root.rglob("*.py"))
             if path != Path(ours_module.__file__) and standard.search(path.read_text())]
    assert found == [], "use `from installer.base.dataclass import dataclass` in these"
