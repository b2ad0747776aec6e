"""Flags made from config fields: one per field of :class:`~lrft.config.TrainConfig` (and of
``lrft train-rm``'s :class:`~lrft.rm.RMTrainConfig`), same name.

A field's metadata (:func:`lrft.config.flag_spec.flag`) names the section of ``--help`` that
lists it and how its value is read; its docstring, read from the source, is the help, with
Sphinx markup turned into plain text. The help ends with the default as :func:`shown_default`
renders it: the config's default, and the built-in demo's where the demo sets another.
"""

from __future__ import annotations

import argparse
import ast
import enum
import functools
import inspect
import itertools
import re
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from lrft.config import TrainConfig
from lrft.config.flag_spec import FLAG_SPEC, Choices, FlagGroup, FlagSpec


@attrs.frozen(kw_only=True)
class Flag:
    """One flag, as the parser and ``--help`` need it."""

    name: str
    group: enum.Enum
    """Where ``--help`` lists the flag; required, so that no flag is left out of the listing."""
    kind: Callable[[str], Any]
    help: str
    choices: Choices | None = None
    metavar: str | tuple[str, ...] | None = None
    nargs: int | str | None = None
    """How many values the flag takes (``None``: one; ``"+"``: one or more)."""
    computed_default: str | None = None
    """How ``--help`` states a default the config computes from other settings."""
    default: object = None
    """The config's default (an ``attrs.Factory`` when computed)."""


@functools.cache
def _module_tree(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"))


def _defines(node: ast.AST, name: str) -> bool:
    definitions = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    return isinstance(node, definitions) and node.name == name


def _class_node(klass: type) -> ast.ClassDef | None:
    """The definition of ``klass`` in its module's source (found by its qualified name)."""
    try:
        node: ast.AST = _module_tree(inspect.getfile(klass))
    except (OSError, TypeError):  # a built-in class, or no source shipped
        return None
    for name in klass.__qualname__.split("."):
        if name == "<locals>":
            continue
        # a top-level name is among the body's statements; one local to a function may be
        # nested deeper (under an if or a with)
        nodes = getattr(node, "body", [])
        found = [n for n in nodes if _defines(n, name)] or [
            n for n in ast.walk(node) if n is not node and _defines(n, name)
        ]
        if not found:
            return None
        node = found[0]
    return node if isinstance(node, ast.ClassDef) else None


@functools.cache
def attribute_docstrings(cls: type) -> Mapping[str, str]:
    """Each attribute's docstring (the string under its annotated assignment) in ``cls`` and its
    bases, read from their source; an attribute without one is absent."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        node = _class_node(klass)
        body = node.body if node is not None else []
        for target, following in itertools.pairwise(body):
            if (
                isinstance(target, ast.AnnAssign)
                and isinstance(target.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[target.target.id] = inspect.cleandoc(following.value.value)
    return docs


_CITED = re.compile(r"\s*\(:[\w:]+:`[^`]+`\)")
_ROLE = re.compile(r":[\w:]+:`(~?)([^`<]*?)\s*(?:<[^`]*>)?`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str, settings: Collection[str] = ()) -> str:
    """``text`` (a docstring) as ``--help`` shows it: on one line, without Sphinx markup.

    A cross-reference in parentheses is for readers of the code and is dropped; another shows
    its name (``:class:`~a.B``` as ``B``); a literal that names one of ``settings`` shows as
    its flag (````seed```` as ``--seed``), any other without its quotes.
    """
    text = _CITED.sub("", text)
    text = _ROLE.sub(lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], text)
    text = _LITERAL.sub(lambda m: f"--{m[1]}" if m[1] in settings else m[1], text)
    return " ".join(text.split())


def _kind(hint: object) -> tuple[Callable[[str], Any], int | None]:
    """The parser of one value of a field of type ``hint``, and how many values it takes."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if typing.get_origin(hint) is tuple:
        items = typing.get_args(hint)
        if items[-1] is Ellipsis:
            return str, None  # comma-separated, split by the field's converter
        return items[0], len(items)
    assert hint in (bool, int, float, str), hint
    return typing.cast("Callable[[str], Any]", hint), None


def flags_of(config: type) -> tuple[Flag, ...]:
    """The flags of an attrs config class, in field order; a field without a flag group is a
    ``TypeError`` naming it."""
    docs = attribute_docstrings(config)
    hints = typing.get_type_hints(config)
    names = [field.name for field in attrs.fields(config)]
    flags = []
    for field in attrs.fields(config):
        spec = field.metadata.get(FLAG_SPEC)
        if not isinstance(spec, FlagSpec):
            raise TypeError(f"{config.__name__}.{field.name} has no flag group in its metadata")
        kind, count = _kind(hints[field.name])
        flags.append(
            Flag(
                name=field.name,
                group=spec.group,
                kind=spec.kind or kind,
                help=plain_text(docs.get(field.name, ""), names),
                choices=spec.choices,
                metavar=spec.metavar,
                nargs=spec.nargs or count,
                computed_default=spec.computed_default,
                default=field.default,
            )
        )
    return tuple(flags)


FLAGS: tuple[Flag, ...] = flags_of(TrainConfig)
"""``lrft train``'s flags, one per :class:`TrainConfig` field."""


def _text(value: object, flag: Flag) -> str:
    """A value as it is typed: ``on``/``off``, ``unset`` for ``None``, several values as the
    flag takes them (space- or comma-separated)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    if isinstance(value, tuple | list):
        return (" " if flag.nargs else ",").join(map(str, value)) if value else "none"
    return str(value)


def shown_default(flag: Flag, variants: Iterable[tuple[str, Mapping[str, object]]] = ()) -> str:
    """``default: X`` for ``flag``, followed by ``; LABEL: Y`` for each of ``variants`` (a
    label and the settings it brings, such as the built-in demo's) that sets another value. A
    default computed from other settings is shown as the flag's ``computed_default``."""
    if isinstance(flag.default, attrs.Factory):  # type: ignore[arg-type]  # attrs.Factory is a class
        if flag.computed_default is None:
            raise TypeError(f"flag {flag.name}: its default is computed; give computed_default")
        return f"default: {flag.computed_default}"
    text = f"default: {_text(flag.default, flag)}"
    for label, settings in variants:
        if flag.name in settings and settings[flag.name] != flag.default:
            text += f"; {label}: {_text(settings[flag.name], flag)}"
    return text


def add_flag(section: argparse._ActionsContainer, flag: Flag, text: str) -> None:
    """``--NAME`` with help ``text``; a bool field is a switch that also takes ``--no-NAME``."""
    # The config supplies every default (the demo's and presets' among them), so argparse keeps
    # none (SUPPRESS: an absent flag is absent from the namespace); the help shows them instead.
    text = text.replace("%", "%%")
    if flag.kind is bool:
        section.add_argument(
            f"--{flag.name}",
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=text,
        )
        return
    section.add_argument(
        f"--{flag.name}",
        type=flag.kind,
        choices=flag.choices() if callable(flag.choices) else flag.choices,
        default=argparse.SUPPRESS,
        metavar=flag.metavar,
        nargs=flag.nargs,
        help=text,
    )


def add_grouped_flags(
    parser: argparse.ArgumentParser,
    flags: Sequence[Flag],
    groups: type[enum.Enum],
    variants: Iterable[tuple[str, Mapping[str, object]]] = (),
) -> None:
    """Each flag under its group's section (in ``groups``' order), its help ending with its
    default (and each variant's that differs)."""
    sections = {group: parser.add_argument_group(group.value) for group in groups}
    variants = tuple(variants)
    for flag in flags:
        add_flag(sections[flag.group], flag, f"{flag.help} [{shown_default(flag, variants)}]")


def translate_names(flags: Iterable[Flag], known_engines: Collection[str]) -> dict[str, Any]:
    """What :func:`lrft.cli.lightrft.translate` needs to know of a command's flags."""
    flags = tuple(flags)
    return {
        "switches": {f.name for f in flags if f.kind is bool},
        "valued": {f.name for f in flags if f.kind is not bool},
        "known_engines": set(known_engines),
    }


__all__ = ["FLAGS", "Flag", "FlagGroup", "add_grouped_flags", "flags_of", "shown_default"]
