"""How every YAML file slotsweep reads is validated, and its problems as one line each.

:class:`ConfigModel` is the base of every model of the experiment config and the cluster
file (unknown fields and scalars of the wrong kind refused); :func:`validation_problems`
turns a pydantic ``ValidationError`` into one line per problem, ``<field path>: <what is
wrong>``. Shared by every file (the experiment config's own formatter adds
hyperparameter-specific wording on top), so users see one style.

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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

VALUE_ERROR_PREFIX = "Value error, "
# The largest value of an SQL ``Integer`` column (PostgreSQL's is 32-bit): counts that are
# stored, or multiply into stored counts, are bounded by it.
INT32_MAX = 2**31 - 1
# pydantic's error types for a value that is no boolean.
_BOOLEAN_ERRORS = frozenset({"bool_type", "bool_parsing"})


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


def is_boolean_annotation(annotation: Any) -> bool:
    """Whether a field annotated ``annotation`` holds a boolean (``bool``, ``Literal[True]``).

    pydantic's lax mode reads ``1``, ``"yes"`` and ``"true"`` as ``True`` for such a field
    (and ``Literal[True]`` takes ``1``); config models refuse all but YAML's booleans.

    Example:
        >>> is_boolean_annotation(bool | None), is_boolean_annotation(Literal[True])
        (True, True)
        >>> is_boolean_annotation(int), is_boolean_annotation(Literal["a", True])
        (False, False)
    """
    if annotation is bool:
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return all(isinstance(arg, bool) for arg in args)
    members = [arg for arg in args if arg is not type(None)]
    return bool(members) and all(is_boolean_annotation(arg) for arg in members)


class _Mistyped:
    """A YAML scalar of the wrong kind for its field: pydantic refuses it as that kind.

    Its ``repr`` is the value as the user wrote it (``true``, ``'yes'``, ``1``), which the
    one-line message shows after ``got``.
    """

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return str(self.value).lower() if isinstance(self.value, bool) else repr(self.value)


def mark_mistyped_scalars(model: type[BaseModel], data: Any) -> Any:
    """``data`` with each scalar marked that pydantic's lax mode would convert for its field.

    Marked: YAML's ``true``/``false`` given for a number field, and anything but
    ``true``/``false`` (``1``, ``"yes"``, ``"true"``) given for a boolean field. The field's
    own validation then refuses the mark (``Input should be a valid number (got true)``,
    ``must be true or false (got 'yes')``) at the field's own path, as it refuses any
    other value of the wrong kind. :class:`ConfigModel` calls it for every model.
    """
    if not isinstance(data, dict):
        return data
    marked: dict[Any, Any] | None = None
    for name, value in data.items():
        field = model.model_fields.get(name) if isinstance(name, str) else None
        if field is None or value is None:
            continue  # An unknown field, or null: pydantic's own message says what is wrong.
        if (isinstance(value, bool) and is_number_annotation(field.annotation)) or (
            # The scalars lax mode converts; lists and mappings it refuses by itself.
            isinstance(value, (int, float, str))
            and not isinstance(value, bool)
            and is_boolean_annotation(field.annotation)
        ):
            marked = marked if marked is not None else dict(data)
            marked[name] = _Mistyped(value)
    return data if marked is None else marked


class ConfigModel(BaseModel):
    """The base of every model read from a user's file (experiment config, cluster file).

    Unknown fields are refused (a typo never falls back to a default), values are
    frozen, and a scalar of the wrong kind is refused rather than converted: YAML's
    ``true`` is no 1, and ``1`` or ``"yes"`` no ``true`` (:func:`mark_mistyped_scalars`).
    One base, so every file and every field follows the same rules.

    Example:
        >>> class Pool(ConfigModel):
        ...     preemption: bool = False
        >>> try:
        ...     Pool.model_validate({"preemption": "yes"})
        ... except ValidationError as exc:
        ...     print(validation_problems(exc, Pool))
        ["preemption: must be true or false (got 'yes')"]
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_mistyped_scalars(cls, data: Any) -> Any:
        return mark_mistyped_scalars(cls, data)


def validation_problems(exc: ValidationError, root: type[BaseModel]) -> list[str]:
    """Every error of ``exc`` as one line, sorted and without duplicates."""
    return sorted({format_error(error, root) for error in exc.errors()})


# The type of an error whose input is not repeated: it may hold a credential.
SECRET_INPUT_ERROR = "secret_input"


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
    if kind in _BOOLEAN_ERRORS:
        # pydantic's "a valid boolean" would let users think "yes" or 1 is one.
        msg = "must be true or false"
    got = error.get("input")
    if kind not in ("model_type", SECRET_INPUT_ERROR) and not isinstance(got, (dict, list)):
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
