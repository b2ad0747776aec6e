"""A row's images: where each comes from, and reading one with an error that names it.

A row's ``images_key`` column holds one image or a list of them, each as:

- a path (a string): absolute, or relative to the folder of the data file (a ``datasets``
  folder: relative to that folder);
- bytes of an encoded image (a Parquet binary column);
- a ``{"bytes": ..., "path": ...}`` record, as ``datasets``' ``Image`` feature stores an image
  (in its Parquet files and ``save_to_disk`` folders): the bytes when present, else the path;
- a decoded PIL image.

:func:`read_image` decodes one completely (so a truncated file fails here, not in the
processor), converts it to RGB and refuses one over ``max_pixels``; every error names the row,
the data file and the image. Pillow is imported on first use.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from lrft.api.media import is_pil_image
from lrft.data.errors import PromptDataError
from lrft.data.located import LocatedSource, locate_encoded, row_sources
from lrft.data.sources import import_optional

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
"""Images above this many pixels are refused (the processor would scale them down anyway, and
a much larger one is more likely a mistake or a decompression bomb than a prompt)."""


@attrs.frozen(kw_only=True, eq=False)
class ImageSource(LocatedSource):
    """Where one image of a row comes from: exactly one of ``path``, ``data`` or ``image``."""

    image: PILImage | None = None


def image_sources(value: object, *, base: Path, where: str, key: str) -> tuple[ImageSource, ...]:
    """The images of a row's ``key`` column (one item or a list; ``None`` is no image)."""
    return row_sources(value, key=key, where=where, locate=lambda item, at: _source(item, base, at))


def _source(item: object, base: Path, where: str) -> ImageSource:
    found = locate_encoded(item, base=base, where=where, noun="image", make=ImageSource)
    if found is not None:
        return found
    if is_pil_image(item):
        return ImageSource(label="a PIL image", image=item)  # type: ignore[arg-type]  # checked by is_pil_image
    raise PromptDataError(
        f"{where}: an image must be a path, bytes, a {{'bytes', 'path'}} record or a PIL image, "
        f"got {type(item).__name__} ({item!r:.60})"
    )


def read_image(source: ImageSource, *, max_pixels: int, where: str) -> PILImage:
    """``source`` decoded completely, in RGB; ``PromptDataError`` naming it when it is missing,
    unreadable or larger than ``max_pixels`` (``where`` names the row)."""
    pil = import_optional("PIL.Image", "pillow", "reading images")
    if source.item:
        where = f"{where}, {source.item}"
    if source.image is not None:
        image: PILImage = source.image
    else:
        if source.path is not None and not source.path.is_file():
            raise PromptDataError(f"{where}: image {source.describe()} does not exist")
        try:
            opened = pil.open(
                source.path if source.path is not None else io.BytesIO(source.data or b"")
            )
        # UnidentifiedImageError is an OSError; a decompression bomb (far above Pillow's own
        # pixel limit) raises before the size check below could.
        except (OSError, ValueError, pil.DecompressionBombError) as error:
            raise PromptDataError(
                f"{where}: image {source.describe()} is not a readable image ({error})"
            ) from error
        image = opened
    width, height = image.size
    if width * height > max_pixels:
        raise PromptDataError(
            f"{where}: image {source.describe()} has {width} x {height} = {width * height} "
            f"pixels, more than max_image_pixels={max_pixels}"
        )
    try:
        image.load()
        rgb: PILImage = image.convert("RGB")
    except (OSError, ValueError, SyntaxError) as error:  # a truncated or corrupt file
        raise PromptDataError(
            f"{where}: image {source.describe()} could not be decoded ({error})"
        ) from error
    return rgb
