"""Where a row's media items (images, audio clips) come from: the forms both kinds share.

An item is a path (absolute, or relative to the data file's folder), bytes of an encoded file,
or a ``{"bytes": ..., "path": ...}`` record as ``datasets``' ``Image`` and ``Audio`` features
store one (the bytes when present, else the path). Each kind adds its own forms (a decoded PIL
image) and its own reader; every error names the row, the data file and the item.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import attrs

from lrft.data.errors import PromptDataError


@attrs.frozen(kw_only=True, eq=False)
class LocatedSource:
    """Where one media item of a row comes from: ``path`` or ``data`` (a kind may add forms).

    ``label`` names it in messages (the path as written, or ``bytes (N B)``), ``item`` its
    place in the row (``'images' item 2``)."""

    label: str
    item: str = ""
    path: Path | None = None
    data: bytes | None = None

    def describe(self) -> str:
        if self.path is not None and self.label != str(self.path):
            return f"{self.label!r} ({self.path})"
        return repr(self.label) if self.path is not None else self.label


S = TypeVar("S", bound=LocatedSource)


def row_sources(
    value: object, *, key: str, where: str, locate: Callable[[object, str], S]
) -> tuple[S, ...]:
    """The items of a row's ``key`` column (one item or a list; ``None`` is none), each located
    by ``locate(item, where)`` and told its place in the row."""
    if value is None:
        return ()
    items: Sequence[object] = value if isinstance(value, list | tuple) else [value]
    sources = []
    for index, item in enumerate(items):
        place = f"{key!r} item {index}"
        sources.append(attrs.evolve(locate(item, f"{where}, {place}"), item=place))
    return tuple(sources)


def locate_encoded(
    item: object, *, base: Path, where: str, noun: str, make: Callable[..., S]
) -> S | None:
    """``item`` as a path, bytes or ``{bytes, path}`` record source made by ``make``; ``None``
    for any other form (the caller's kind may know it). ``noun`` names the kind in errors."""
    if isinstance(item, Mapping) and set(item) <= {"bytes", "path"}:
        data, path = item.get("bytes"), item.get("path")
        part = data if data is not None else path
        if part is None:
            raise PromptDataError(f"{where}: an {noun} record with neither bytes nor a path")
        return locate_encoded(part, base=base, where=where, noun=noun, make=make)
    if isinstance(item, str):
        if not item:
            raise PromptDataError(f"{where}: an empty {noun} path")
        path = Path(item).expanduser()
        return make(label=item, path=path if path.is_absolute() else base / path)
    if isinstance(item, bytes | bytearray | memoryview):
        data = bytes(item)
        return make(label=f"bytes ({len(data)} B)", data=data)
    return None
