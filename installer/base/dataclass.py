"""``dataclass`` for the installer's records, built without compiling code at import.

Every node runs the installer on every boot, and a cache hit imports about ninety of our
records. Python 3.11 and 3.12's ``dataclasses`` write each generated method as source text
and compile it with its own ``exec()`` (``dataclasses._create_fn``): five or six compiles
for a frozen class, about half of our modules' import time on a cache hit
(docs/performance.md). Python 3.13 compiles a class's methods in one ``exec()``
(CPython gh-109870, ``dataclasses._FuncBuilder``).

Here the standard library still does all of the field work (``field()``, defaults and
factories, ``ClassVar``, ``__dataclass_fields__``, ``fields``, ``replace``, ``asdict``,
``__match_args__``), asked for no methods; the methods are then closures over the class's
field names, which need no compiling. They behave as the generated ones do (the test
compares them class by class: tests/unit/test_dataclass.py). A class this does not cover
(options other than ``frozen``, dataclass bases, methods of its own that ``dataclass``
would generate, per-field ``kw_only``, ``InitVar``) and every class on Python 3.13 and
later go to ``dataclasses.dataclass`` itself.

Type checkers read it as ``dataclasses.dataclass``, which is what it is to them.
"""

from __future__ import annotations

import dataclasses
import operator
import reprlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# What ``dataclass`` would write into the class: a class that writes one itself is left
# to the standard library, which knows what to keep.
_GENERATED = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__")
_standard_dataclass = dataclasses.dataclass


def _covered(cls: type, options: dict[str, Any]) -> bool:
    """Whether the methods below stand in for this class's: read before ``dataclass``
    touches the class (it replaces ``field()`` defaults with their values)."""
    if options or sys.version_info >= (3, 13):
        return False
    if any(name in cls.__dict__ for name in _GENERATED):
        return False
    if any(hasattr(base, "__dataclass_fields__") for base in cls.__mro__[1:]):
        return False
    annotations = cls.__dict__.get("__annotations__", {})
    if any("InitVar" in str(kind) or "KW_ONLY" in str(kind) for kind in annotations.values()):
        return False
    return not any(isinstance(value, dataclasses.Field) and value.kw_only is True
                   for value in cls.__dict__.values())


def _values_getter(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """A function from an instance to the tuple of these fields' values, as the generated
    ``__eq__`` and ``__hash__`` compare them (a tuple even of one or none)."""
    if len(names) >= 2:
        return operator.attrgetter(*names)
    if len(names) == 1:
        only = names[0]
        return lambda instance: (getattr(instance, only),)
    return lambda instance: ()


def _make_init(cls: type, fields: list[dataclasses.Field[Any]], frozen: bool) -> Callable[..., None]:
    missing = dataclasses.MISSING
    # Per field in __init__ order: (name, default, factory), MISSING where there is none.
    plan = [(f.name, f.default, f.default_factory) for f in fields if f.init]
    # A field left out of __init__ gets its factory's value; one with a plain default is
    # read from the class attribute, as the standard library leaves it (_field_init).
    made_anyway = [(f.name, f.default_factory) for f in fields
                   if not f.init and f.default_factory is not missing]
    names = [name for name, _, _ in plan]
    optional = [default is not missing or factory is not missing for _, default, factory in plan]
    if any(optional[index] and not optional[index + 1] for index in range(len(plan) - 1)):
        first = next(name for index, (name, _, _) in enumerate(plan)
                     if not optional[index] and any(optional[:index]))
        # the generated __init__'s own check: its def line would not compile
        raise TypeError(f"non-default argument {first!r} follows default argument")
    required = optional.count(False)
    post_init = hasattr(cls, "__post_init__")
    assign: Callable[[Any, str, Any], None] = object.__setattr__ if frozen else setattr
    # Python's own wording for a call that does not fit (CPython Python/ceval.c).
    where = f"{cls.__qualname__}.__init__()"
    takes = (f"takes {len(names) + 1} positional argument{'s' if names else ''}"
             if required == len(names) else
             f"takes from {required + 1} to {len(names) + 1} positional arguments")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(names):
            raise TypeError(f"{where} {takes} but {len(args) + 1} were given")
        for name in kwargs:
            if name not in names:
                raise TypeError(f"{where} got an unexpected keyword argument {name!r}")
            if names.index(name) < len(args):
                raise TypeError(f"{where} got multiple values for argument {name!r}")
        absent = [name for name, default, factory in plan[len(args):]
                  if name not in kwargs and default is missing and factory is missing]
        if absent:
            raise TypeError(f"{where} missing {_count(absent)}")
        for index, (name, default, factory) in enumerate(plan):
            if index < len(args):
                value = args[index]
            elif name in kwargs:
                value = kwargs[name]
            else:
                value = default if factory is missing else factory()
            assign(self, name, value)
        for name, factory in made_anyway:
            assign(self, name, factory())
        if post_init:
            self.__post_init__()

    return __init__


def _count(absent: list[str]) -> str:
    """Python's own wording for missing arguments (CPython Python/ceval.c, format_missing)."""
    quoted = [repr(name) for name in absent]
    listed = (quoted[0] if len(quoted) == 1 else " and ".join(quoted) if len(quoted) == 2
              else ", ".join(quoted[:-1]) + ", and " + quoted[-1])
    plural = "s" if len(quoted) > 1 else ""
    return f"{len(quoted)} required positional argument{plural}: {listed}"


def _make_repr(cls: type, fields: list[dataclasses.Field[Any]]) -> Callable[[Any], str]:
    names = [f.name for f in fields if f.repr]

    @reprlib.recursive_repr()  # what the generated __repr__ is wrapped in
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"

    return __repr__


def _make_eq(fields: list[dataclasses.Field[Any]]) -> Callable[[Any, Any], Any]:
    values = _values_getter([f.name for f in fields if f.compare])

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _make_hash(fields: list[dataclasses.Field[Any]]) -> Callable[[Any], int]:
    # ``hash=None`` follows ``compare``, as the standard library's _hash_fn takes them.
    values = _values_getter([f.name for f in fields
                             if (f.compare if f.hash is None else f.hash)])

    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def _make_frozen(cls: type[Any], fields: list[dataclasses.Field[Any]]) -> list[Callable[..., None]]:
    names = frozenset(f.name for f in fields)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return [__setattr__, __delattr__]


def _build(cls: type, frozen: bool) -> type:
    doc_missing = not cls.__doc__
    if doc_missing:  # spares dataclass its inspect.signature(); written below
        cls.__doc__ = cls.__name__
    _standard_dataclass(init=False, repr=False, eq=False)(cls)
    fields = list(dataclasses.fields(cls))  # ClassVars left out
    # What the class is, for whoever reads it (a dataclass subclass's frozen check among
    # them); set on the standard library's own record of it, whose fields differ by version.
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    for name, value in (("init", True), ("repr", True), ("eq", True), ("frozen", frozen)):
        setattr(params, name, value)
    methods = [_make_init(cls, fields, frozen), _make_repr(cls, fields), _make_eq(fields)]
    if frozen:
        methods += [_make_hash(fields), *_make_frozen(cls, fields)]
    for method in methods:
        method.__qualname__ = f"{cls.__qualname__}.{method.__name__}"
        setattr(cls, method.__name__, method)
    if not frozen:
        cls.__hash__ = None  # type: ignore[assignment]  # eq without frozen: unhashable
    if doc_missing:
        cls.__doc__ = f"{cls.__name__}({', '.join(f.name for f in fields if f.init)})"
    return cls


if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass  # re-exported: the name type checkers know
else:
    def dataclass(cls=None, /, *, frozen=False, **options):
        """``dataclasses.dataclass``, its methods built without compiling code (above)."""

        def wrap(cls):
            if not _covered(cls, options):
                return _standard_dataclass(cls, frozen=frozen, **options)
            return _build(cls, frozen)

        return wrap if cls is None else wrap(cls)
