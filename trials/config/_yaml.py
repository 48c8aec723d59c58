"""The one YAML reader of slotsweep: plain data only, bounded, every problem one line.

``yaml.safe_load`` is safe against code execution but not against hostile input: an
alias bomb (a few hundred bytes whose aliases expand to billions of values) loads as
shared objects and explodes later, when the value is serialised; duplicated keys are
silently merged (the last wins); dates become ``datetime`` objects no JSON column can
hold; deep nesting ends in a ``RecursionError``. The experiment config, the cluster
file and command-line values all need the same answers, so they all read YAML here.

The document is built from the parser's event stream (no recursion, so nesting depth
is checked rather than crashing) into plain Python values: ``None``, ``bool``, ``int``,
``float``, ``str``, ``list`` and ``dict`` with string keys. Refused, each with one line
naming the field path:

- more than :data:`MAX_VALUES` values once aliases are expanded (counted as they are
  read, so a bomb stops after at most that much work and memory);
- nesting deeper than :data:`MAX_DEPTH`; a key given twice in one mapping; keys that
  are not text (``1: x``, ``[a]: b``); a value that contains itself (recursive alias);
- tags other than YAML's plain scalars, lists and mappings: dates and times (quote
  them), ``!!binary``, ``!!set``, ``!!python/...`` and local ``!tags``;
- files over :data:`MAX_FILE_BYTES`, files that are not UTF-8 text, and several
  documents in one file.

Merge keys (``<<: *defaults``) work as in YAML 1.1; aliases are expanded into copies,
so no two places of the result share an object.

Example:
    >>> parse_yaml("base: &b {lr: 0.1}\\nrun: {<<: *b, epochs: 2}\\n", source="text")
    {'base': {'lr': 0.1}, 'run': {'epochs': 2, 'lr': 0.1}}
    >>> parse_yaml("a: 1\\na: 2\\n", source="text")
    Traceback (most recent call last):
    ...
    trials.config._yaml.YamlError: a: key given twice (first at line 1); each key may appear once
"""

from __future__ import annotations

import dataclasses
import marshal
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from trials.config._validation import field_path

# A config or cluster file is a few kilobytes; these bound what hostile input may cost.
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_VALUES = 250_000
MAX_DEPTH = 64

_TAG = "tag:yaml.org,2002:"
_STR, _SEQ, _MAP, _MERGE = _TAG + "str", _TAG + "seq", _TAG + "map", _TAG + "merge"
_SCALAR_TAGS = {_TAG + kind: kind for kind in ("null", "bool", "int", "float", "str")}
# libyaml's parser is about 10x faster than PyYAML's; both produce the same events.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_RESOLVER = Resolver()
# marshal's last format without back-references (version 3 added them).
_UNSHARED_MARSHAL_VERSION = 2
_CONSTRUCTOR = SafeConstructor()
_MISSING: Any = object()


class YamlError(Exception):
    """YAML that slotsweep will not read; ``problems`` holds the line(s) to show."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def read_yaml(path: str | Path, *, source: str, field_prefix: str = "") -> Any:
    """The plain data in the YAML file at ``path``; raises :class:`YamlError`.

    ``source`` names the file's role in problems about the whole file (``config``,
    ``--cluster``); ``field_prefix`` is put before the field path of problems inside it.
    """
    path = Path(path)
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise YamlError([f"{source}: cannot read {path}: {exc.strerror}"]) from None
    if len(raw) > MAX_FILE_BYTES:
        limit = MAX_FILE_BYTES // (1024 * 1024)
        raise YamlError([f"{source}: {path} is larger than {limit} MiB; is it the right file?"])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise YamlError([f"{source}: {path} is not UTF-8 text"]) from None
    return parse_yaml(text, source=f"{source}: {path}", field_prefix=field_prefix)


def parse_yaml(text: str, *, source: str, field_prefix: str = "") -> Any:
    """The plain data in YAML ``text``; raises :class:`YamlError` (see the module docstring)."""
    try:
        return _build(text, source, field_prefix, _LOADER)
    except _LibyamlDepthRefusal:
        # libyaml (bundled since PyYAML 6.0.3) refuses deep nesting on its own, parsing
        # ahead of the events it hands out; PyYAML's own parser does not read ahead, so
        # the builder refuses at MAX_DEPTH with the field path, whichever loader is
        # installed.
        return _build(text, source, field_prefix, yaml.SafeLoader)


class _LibyamlDepthRefusal(Exception):
    """libyaml stopped at its own nesting limit before the builder saw that deep."""


def _build(text: str, source: str, field_prefix: str, loader: Any) -> Any:
    """The document built from ``loader``'s events; every error as one :class:`YamlError`."""
    builder = _Builder(source, field_prefix)
    try:
        for event in yaml.parse(text, Loader=loader):
            builder.feed(event)
    except yaml.MarkedYAMLError as exc:
        if loader is not yaml.SafeLoader and "nesting depth" in str(exc.problem):
            raise _LibyamlDepthRefusal from None
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = f" ({exc.problem})" if exc.problem else ""
        raise YamlError([f"{source} is not valid YAML{where}{problem}"]) from None
    except yaml.reader.ReaderError as exc:
        raise YamlError(
            [
                f"{source} is not valid YAML (a control character or binary data at character {exc.position})"
            ]
        ) from None
    except (yaml.YAMLError, UnicodeError):
        raise YamlError([f"{source} is not valid YAML text"]) from None
    return builder.result


@dataclasses.dataclass
class _Collection:
    """A list or mapping still being read."""

    value: Any
    path: tuple[Any, ...]
    anchor: str | None
    size: int  # Values read so far in it, itself included, aliases expanded.
    key: Any = _MISSING  # A mapping's key waiting for its value.
    key_lines: dict[str, int | None] = dataclasses.field(default_factory=dict)
    merges: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class _Builder:
    """Plain Python values from a stream of parser events, checked as they arrive."""

    def __init__(self, source: str, field_prefix: str) -> None:
        self._source = source
        self._prefix = field_prefix
        self._stack: list[_Collection] = []
        self._anchors: dict[str, tuple[Any, int]] = {}
        self._open_anchors: set[str] = set()
        self._total = 0
        self._documents = 0
        self.result: Any = None

    def feed(self, event: yaml.Event) -> None:
        if isinstance(event, yaml.DocumentStartEvent):
            self._documents += 1
            if self._documents > 1:
                raise YamlError(
                    [f"{self._source} holds more than one YAML document (a second '---')"]
                )
        elif isinstance(event, yaml.ScalarEvent):
            self._scalar(event)
        elif isinstance(event, yaml.AliasEvent):
            self._alias(event)
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            self._start(event)
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            self._end()

    def _fail(self, path: tuple[Any, ...], problem: str) -> YamlError:
        return YamlError([f"{self._prefix}{field_path(path)}: {problem}"])

    def _awaiting_key(self) -> _Collection | None:
        """The mapping being read when its next value is a key, else None."""
        top = self._stack[-1] if self._stack else None
        if top is not None and isinstance(top.value, dict) and top.key is _MISSING:
            return top
        return None

    def _child_path(self) -> tuple[Any, ...]:
        """The field path of the value about to be read."""
        if not self._stack:
            return ()
        top = self._stack[-1]
        if isinstance(top.value, list):
            return (*top.path, len(top.value))
        if top.key is _MISSING or top.key is _MERGE:
            return top.path
        return (*top.path, top.key)

    def _count(self, size: int) -> None:
        self._total += size
        if self._total > MAX_VALUES:
            raise self._fail(
                self._child_path(),
                f"the document expands to more than {MAX_VALUES} values (aliases "
                "included); slotsweep reads at most that many",
            )

    def _scalar(self, event: yaml.ScalarEvent) -> None:
        tag = event.tag
        if tag is None or tag == "!":
            tag = _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit)
        top = self._awaiting_key()
        if top is not None:
            if tag == _MERGE:
                self._count(1)
                top.key = _MERGE
                return
            if tag != _STR:
                raise self._fail(
                    top.path,
                    f"the key {_shorten(event.value)} is not text (YAML reads it as "
                    f"{tag.removeprefix(_TAG)}); quote it",
                )
        path = self._child_path()
        kind = _SCALAR_TAGS.get(tag)
        if kind is None:
            raise self._fail(path, _tag_problem(tag, event.value))
        value: Any = event.value
        if tag != _STR:
            # The scalar constructors themselves: construct_object would remember every
            # node in the shared constructor for the life of the process.
            node = yaml.ScalarNode(tag, event.value, style=event.style)
            try:
                value = _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, node)
            except (ValueError, KeyError, TypeError, yaml.YAMLError):
                raise self._fail(path, f"{_shorten(event.value)} is not a valid {kind}") from None
        if isinstance(value, str) and "\x00" in value:
            # PostgreSQL's text and JSON columns cannot hold NUL characters.
            raise self._fail(path, "text may not contain NUL characters (\\0)")
        self._count(1)
        self._add(value, 1, event.anchor, _line(event))

    def _alias(self, event: yaml.AliasEvent) -> None:
        name = event.anchor
        path = self._child_path()
        if name in self._open_anchors:
            raise self._fail(path, f"a value may not contain itself (alias *{name})")
        if name not in self._anchors:
            raise self._fail(path, f"alias *{name} refers to no anchor &{name} before it")
        value, size = self._anchors[name]
        top = self._awaiting_key()
        if top is not None and not isinstance(value, str):
            raise self._fail(top.path, f"the key *{name} is not text")
        self._count(size)  # Before copying: a bomb stops here, not after the copy.
        self._add(_copied(value), size, None, _line(event))

    def _start(self, event: yaml.SequenceStartEvent | yaml.MappingStartEvent) -> None:
        mapping = isinstance(event, yaml.MappingStartEvent)
        top = self._awaiting_key()
        if top is not None:
            raise self._fail(top.path, "keys must be text, not lists or mappings")
        path = self._child_path()
        if event.tag not in (None, "!", _MAP if mapping else _SEQ):
            raise self._fail(path, _tag_problem(event.tag, None))
        if len(self._stack) >= MAX_DEPTH:
            raise self._fail(path, f"nested more than {MAX_DEPTH} levels deep")
        self._count(1)
        if event.anchor is not None:
            self._open_anchors.add(event.anchor)
        value: Any = {} if mapping else []
        self._stack.append(_Collection(value=value, path=path, anchor=event.anchor, size=1))

    def _end(self) -> None:
        done = self._stack.pop()
        if isinstance(done.value, dict):
            # Keys written in the mapping win over merged ones; earlier merges over later.
            for merged in done.merges:
                for key, item in merged.items():
                    done.value.setdefault(key, item)
        if done.anchor is not None:
            self._open_anchors.discard(done.anchor)
        self._add(done.value, done.size, done.anchor, None)

    def _add(self, value: Any, size: int, anchor: str | None, line: int | None) -> None:
        """Put a finished value into the collection being read (or make it the result)."""
        if anchor is not None:
            self._anchors[anchor] = (value, size)
        if not self._stack:
            self.result = value
            return
        top = self._stack[-1]
        top.size += size
        if isinstance(top.value, list):
            top.value.append(value)
        elif top.key is _MISSING:
            if value in top.key_lines:
                first = top.key_lines[value]
                at = f" (first at line {first + 1})" if first is not None else ""
                raise self._fail(
                    (*top.path, value), f"key given twice{at}; each key may appear once"
                )
            top.key_lines[value] = line
            top.key = value
        elif top.key is _MERGE:
            top.merges.extend(self._merge_sources(value, top.path))
            top.key = _MISSING
        else:
            top.value[top.key] = value
            top.key = _MISSING

    def _merge_sources(self, value: Any, path: tuple[Any, ...]) -> list[dict[str, Any]]:
        sources = value if isinstance(value, list) else [value]
        if not all(isinstance(source, dict) for source in sources):
            raise self._fail(
                (*path, "<<"), "a merge key takes a mapping or a list of mappings (aliases)"
            )
        return sources


def _line(event: yaml.Event) -> int | None:
    """The 0-based line an event starts on, when the parser says."""
    mark = event.start_mark
    return mark.line if mark is not None else None


def _shorten(text: str, limit: int = 40) -> str:
    """``text`` quoted for a message, cut to ``limit`` characters: one line stays short."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _tag_problem(tag: str, value: str | None) -> str:
    if tag == _TAG + "timestamp":
        return f"{value} reads as a YAML date; quote it ('{value}') to use it as text"
    shown = tag.replace(_TAG, "!!")
    return f"the YAML tag {shown} is not supported; use plain values, lists and mappings" + (
        " (quote the value to keep it as text)" if value is not None else ""
    )


def _copied(value: Any) -> Any:
    """A copy of a value read from YAML (mappings, lists, immutable scalars), for an alias.

    An alias must not share its anchor's lists and mappings (a later change to one would
    show in the other), so each use is a copy, made by :mod:`marshal` in C: about 2.5
    times faster than a recursive copy in Python and 15 times faster than
    ``copy.deepcopy``, which an alias-heavy document (up to :data:`MAX_VALUES` values)
    pays in full. Version 2 of its format writes every occurrence of an object out in
    full (no back-references), so nothing in the copy is shared, within it or with the
    anchor; the values here are only the plain kinds it writes.

    Example:
        >>> anchor = {"a": [1, {"b": 2}]}
        >>> copied = _copied(anchor)
        >>> copied == anchor, copied["a"] is anchor["a"], copied["a"][1] is anchor["a"][1]
        (True, False, False)
        >>> shared = [1]
        >>> twice = _copied({"x": shared, "y": shared})
        >>> twice["x"] is twice["y"]
        False
    """
    if isinstance(value, (dict, list)):
        return marshal.loads(marshal.dumps(value, _UNSHARED_MARSHAL_VERSION))
    return value
