"""One line per problem for a pydantic ``ValidationError``: ``<field path>: <what is wrong>``.

Shared by every YAML file slotsweep reads (the cluster file here; the experiment config's
own formatter adds hyperparameter-specific wording on top), so users see one style.

Example:
    >>> from pydantic import BaseModel, ConfigDict, ValidationError
    >>> class Pool(BaseModel):
    ...     model_config = ConfigDict(extra="forbid")
    ...     name: str
    >>> try:
    ...     Pool.model_validate({"nmae": "x"})
    ... except ValidationError as exc:
    ...     print(validation_problems(exc, Pool))
    ['name: required field is missing', 'nmae: unknown field; allowed: name']
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ValidationError

VALUE_ERROR_PREFIX = "Value error, "
# The largest value of an SQL ``Integer`` column (PostgreSQL's is 32-bit): counts that are
# stored, or multiply into stored counts, are bounded by it.
INT32_MAX = 2**31 - 1


def is_number_annotation(annotation: Any) -> bool:
    """Whether a field annotated ``annotation`` holds a number (``int``, ``float``, optional).

    pydantic's lax mode reads YAML's ``true`` as 1 for such a field; a boolean where a
    number belongs is a mistake, and config models refuse it with this test.

    Example:
        >>> is_number_annotation(float | None), is_number_annotation(bool)
        (True, False)
    """
    if annotation in (int, float):
        return True
    args = typing.get_args(annotation)
    return bool not in args and any(arg in (int, float) for arg in args)


class _BooleanForNumber:
    """A YAML boolean found where a number belongs: pydantic refuses it as no number."""

    def __init__(self, value: bool) -> None:
        self.value = value

    def __repr__(self) -> str:
        return str(self.value).lower()


def mark_boolean_numbers(model: type[BaseModel], data: Any) -> Any:
    """``data`` with every ``true``/``false`` given for a number field of ``model`` marked.

    The field's own validation then refuses the mark (``Input should be a valid
    number (got true)``) at the field's own path, as it refuses any other non-number.
    Call it from a ``mode="before"`` model validator.
    """
    if not isinstance(data, dict):
        return data
    marked: dict[Any, Any] | None = None
    for name, value in data.items():
        if not isinstance(value, bool):
            continue
        field = model.model_fields.get(name) if isinstance(name, str) else None
        if field is not None and is_number_annotation(field.annotation):
            marked = marked if marked is not None else dict(data)
            marked[name] = _BooleanForNumber(value)
    return data if marked is None else marked


def validation_problems(exc: ValidationError, root: type[BaseModel]) -> list[str]:
    """Every error of ``exc`` as one line, sorted and without duplicates."""
    return sorted({format_error(error, root) for error in exc.errors()})


def format_error(error: Any, root: type[BaseModel]) -> str:
    """One pydantic error (an item of ``exc.errors()``) as ``<field path>: <problem>``."""
    loc = tuple(error["loc"])
    kind = error["type"]
    msg = error["msg"]
    path = field_path(loc)
    if kind == "extra_forbidden":
        allowed = allowed_fields(root, loc)
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return f"{path}: unknown field{hint}"
    if kind == "missing":
        return f"{path}: required field is missing"
    msg = msg.removeprefix(VALUE_ERROR_PREFIX)
    got = error.get("input")
    if kind != "model_type" and not isinstance(got, (dict, list)):
        return f"{path}: {msg} (got {got!r})"
    return f"{path}: {msg}"


def field_path(loc: tuple[Any, ...]) -> str:
    """``resource_pools.0.agents.1.slots``; ``<top level>`` for the document itself."""
    return ".".join(str(part) for part in loc) or "<top level>"


def allowed_fields(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """Field names allowed where the unknown field ``loc[-1]`` was found.

    Walks models, lists (integer parts), mappings (their keys) and discriminated unions
    (pydantic puts the chosen tag, e.g. ``log``, in the path).
    """
    current: Any = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # a list index: the item type is unwrapped below
        tagged = _tagged_member(current, part)
        if tagged is not None:
            current = tagged
            continue
        if typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]  # ``part`` was a key of the mapping
            continue
        model = _model_in(current)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        current = field.annotation
    model = _model_in(current)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _model_in(annotation: Any) -> Any:
    """The model inside ``list[Model]``, ``Model | None`` and the like, else the annotation."""
    models = _models_in(annotation)
    return models[0] if models else annotation


def _tagged_member(annotation: Any, tag: Any) -> type[BaseModel] | None:
    """The union member whose ``Literal`` discriminator field equals ``tag``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return None
    for model in _models_in(annotation):
        for field in model.model_fields.values():
            if typing.get_origin(field.annotation) is typing.Literal and tag in typing.get_args(
                field.annotation
            ):
                return model
    return None
