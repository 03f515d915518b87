"""The base of every config section, and of the things a config lists by kind - an indicator by its `name`, a
layer by its `kind` - which carry their own behaviour (an indicator computes itself, a layer builds itself).

A kind is one class: subclassing its family's base with the tag field as a Literal registers it, and a config
list of that family (`listed`) accepts it, with its own fields checked. The tags are the registry's keys, never
kept by hand.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, get_args

from pydantic import BaseModel, ConfigDict, SerializeAsAny, WrapValidator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Kind(Strict):
    """The base of a family of kinds. A family's base sets `tag`, the field whose value names the kind; each
    subclass that declares that field as a Literal is registered in the family's `kinds` under that value
    (intermediate bases, whose tag field is not a Literal, are not)."""
    tag: ClassVar[str]
    kinds: ClassVar[dict[str, type[Kind]]]
    default: ClassVar[str | None] = None  # the kind of a mapping without the tag (None: the tag is required)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "tag" in cls.__dict__:  # a family's base: a registry of its own
            cls.kinds = {}
            return
        values = get_args(cls.model_fields[cls.tag].annotation)
        if values:
            cls.kinds[values[0]] = cls


def no_duplicates(items: list[str], what: str) -> None:
    dupes = sorted({x for x in items if items.count(x) > 1})
    if dupes:
        raise ValueError(f"duplicate {what}: {', '.join(dupes)}")


def listed(family: type[Kind]) -> Any:
    """The type of one item of a config list of `family`'s kinds: a mapping is validated by the class its tag
    names (an unknown tag is one error naming the known ones); an instance of a kind is taken as it is. Dumped
    with every field of its kind."""

    def choose(value: Any, handler: Any) -> Any:
        if isinstance(value, dict):
            kind = value.get(family.tag, family.default)
            if kind not in family.kinds:
                raise ValueError(f"unknown kind {kind!r}; expected one of: {', '.join(map(repr, family.kinds))}")
            return family.kinds[kind].model_validate({**value, family.tag: kind})
        return handler(value)

    return Annotated[SerializeAsAny[family], WrapValidator(choose)]
