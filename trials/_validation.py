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
    """Field names allowed where the unknown field ``loc[-1]`` was found."""
    current: Any = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # a list index: the item type was already unwrapped
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        current = _model_in(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return None


def _model_in(annotation: Any) -> Any:
    """The model inside ``list[Model]``, ``Model | None`` and the like, else the annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if isinstance(found, type) and issubclass(found, BaseModel):
            return found
    return annotation
