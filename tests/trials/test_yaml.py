"""The bounded YAML reader: plain data in, one line per refusal, bounded time and memory."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml

from trials.config._yaml import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_VALUES,
    YamlError,
    parse_yaml,
    read_yaml,
)


def _problem(text: str) -> str:
    with pytest.raises(YamlError) as info:
        parse_yaml(text, source="doc")
    [line] = info.value.problems
    return line


def _alias_bomb(levels: int, where: str = "data") -> str:
    """Billion laughs: each level lists the previous one ten times (10**levels values)."""
    lines = [f"{where}:", "  l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, levels):
        refs = ", ".join([f"*l{level - 1}"] * 10)
        lines.append(f"  l{level}: &l{level} [{refs}]")
    return "\n".join(lines) + "\n"


def test_plain_data_loads() -> None:
    text = "a: [1, 2.5, -3, null, true, 'x', 0x10]\nb: {c: '2024-01-31', d: ''}\n"
    assert parse_yaml(text, source="doc") == {
        "a": [1, 2.5, -3, None, True, "x", 16],
        "b": {"c": "2024-01-31", "d": ""},
    }
    assert parse_yaml("", source="doc") is None


def test_aliases_and_merge_keys_become_independent_copies() -> None:
    text = "base: &b {lr: 0.1, layers: [64]}\nrun: {<<: *b, lr: 0.2}\nagain: *b\n"
    data = parse_yaml(text, source="doc")
    assert data["run"] == {"lr": 0.2, "layers": [64]}
    assert data["again"] == data["base"]
    assert data["again"]["layers"] is not data["base"]["layers"]
    assert parse_yaml("a: &a {x: 1}\nb: &b {y: 2}\nc: {<<: [*a, *b], x: 3}\n", source="doc")[
        "c"
    ] == {"x": 3, "y": 2}


def test_an_alias_bomb_is_refused_in_bounded_time_and_memory() -> None:
    text = _alias_bomb(9, where="x")  # 10**9 values once expanded
    tracemalloc.start()
    started = time.monotonic()
    try:
        problem = _problem(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 10
    assert peak < 200 * 1024 * 1024
    assert problem.startswith("x.")
    assert f"expands to more than {MAX_VALUES} values" in problem


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "a: 1\nb:\n  c: 2\n  c: 3\n",
            "b.c: key given twice (first at line 3); each key may appear once",
        ),
        ("a: &a [1, *a]\n", "a.1: a value may not contain itself (alias *a)"),
        ("a: *b\n", "a: alias *b refers to no anchor &b before it"),
        (
            "when: 2024-01-31\n",
            "when: 2024-01-31 reads as a YAML date; quote it ('2024-01-31') to use it as text",
        ),
        ("t: 2024-01-31 10:00:00\n", "t: 2024-01-31 10:00:00 reads as a YAML date; quote it"),
        ("a: !!binary aGk=\n", "a: the YAML tag !!binary is not supported"),
        ("a: !!set {x}\n", "a: the YAML tag !!set is not supported"),
        (
            "a: !!python/name:os.system\n",
            "a: the YAML tag !!python/name:os.system is not supported",
        ),
        ("a: !local 1\n", "a: the YAML tag !local is not supported"),
        ("a: !!int nope\n", "a: 'nope' is not a valid int"),
        (
            "a: " + "9" * 5000 + "\n",
            "a: '9999999999999999999999999999999999999999...' is not a valid int",
        ),
        ("1: x\n", "<top level>: the key '1' is not text (YAML reads it as int); quote it"),
        ("? [a]\n: b\n", "<top level>: keys must be text, not lists or mappings"),
        ('a: "x\\0y"\n', "a: text may not contain NUL characters"),
        ("a: {<<: 3}\n", "a.<<: a merge key takes a mapping or a list of mappings (aliases)"),
        ("a: 1\n---\nb: 2\n", "doc holds more than one YAML document (a second '---')"),
        ("a: [1\n", "doc is not valid YAML at line 2, column 1"),
        ("a: \x01\n", "doc is not valid YAML (a control character or binary data at character 3)"),
    ],
)
def test_refusals_are_one_line_naming_the_field(text: str, problem: str) -> None:
    assert _problem(text).startswith(problem)


_LOADERS = [yaml.SafeLoader] + ([yaml.CSafeLoader] if hasattr(yaml, "CSafeLoader") else [])


@pytest.mark.parametrize("loader", _LOADERS, ids=lambda loader: loader.__name__)
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 999, 1001, 200_000])
def test_deep_nesting_is_refused_without_recursion(
    monkeypatch: pytest.MonkeyPatch, loader: Any, depth: int
) -> None:
    # libyaml refuses past its own limit (1000 levels, PyYAML >= 6.0.3) before slotsweep
    # sees that deep: the same line comes out whichever parser refuses first.
    monkeypatch.setattr("trials.config._yaml._LOADER", loader)
    text = "a: " + "[" * depth + "]" * depth + "\n"
    problem = _problem(text)
    assert problem == "a" + ".0" * (MAX_DEPTH - 1) + f": nested more than {MAX_DEPTH} levels deep"
    nested: Any = parse_yaml("[" * MAX_DEPTH + "]" * MAX_DEPTH, source="doc")
    for _ in range(MAX_DEPTH - 1):
        [nested] = nested
    assert nested == []


def test_a_large_document_stops_at_the_value_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # A smaller limit keeps the test fast; the alias bomb above meets the real one.
    monkeypatch.setattr("trials.config._yaml.MAX_VALUES", 1000)
    text = "".join(f"k{i}: {i}\n" for i in range(499))  # 1 mapping, 998 scalars
    assert len(parse_yaml(text, source="doc")) == 499
    problem = _problem(text + "k499: 1\n")
    assert problem == (
        "k499: the document expands to more than 1000 values (aliases included); "
        "slotsweep reads at most that many"
    )


def test_files_that_are_not_utf8_text_or_too_large(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: café\n".encode("latin-1"))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))
    large = tmp_path / "large.yaml"
    with large.open("wb") as stream:
        stream.truncate(MAX_FILE_BYTES + 1)
    for path, problem in [
        (latin1, f"config: {latin1} is not UTF-8 text"),
        (binary, f"config: {binary} is not UTF-8 text"),
        (large, f"config: {large} is larger than 16 MiB; is it the right file?"),
        (tmp_path, f"config: cannot read {tmp_path}: Is a directory"),
        (tmp_path / "none.yaml", f"config: cannot read {tmp_path / 'none.yaml'}: No such file"),
    ]:
        with pytest.raises(YamlError) as info:
            read_yaml(path, source="config")
        [line] = info.value.problems
        assert line.startswith(problem), line


def test_field_problems_carry_the_callers_prefix(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("\ufeffa: {b: 1, b: 2}\n")  # A byte-order mark is allowed.
    with pytest.raises(YamlError) as info:
        read_yaml(path, source="cluster", field_prefix=f"cluster {path}: ")
    assert info.value.problems == [
        f"cluster {path}: a.b: key given twice (first at line 1); each key may appear once"
    ]
