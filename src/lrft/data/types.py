"""Value types of the data layer: one prompt ready for rollout, and what loading kept or dropped.

attrs classes, frozen and keyword-only, validated at construction like those of :mod:`lrft.api`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from lrft.api import validators as v
from lrft.api.media import MediaInputs

if TYPE_CHECKING:
    from lrft.data.audio import AudioSource
    from lrft.data.images import ImageSource


def _sources(values: Any) -> tuple[ImageSource, ...]:
    return tuple(values)


def _audio_sources(values: Any) -> tuple[AudioSource, ...]:
    return tuple(values)


def _non_empty_token_ids(
    _: object, attribute: attrs.Attribute[Any], value: tuple[int, ...]
) -> None:
    if not value:
        raise ValueError(f"{attribute.name} must not be empty")
    negative = [token for token in value if token < 0]
    if negative:
        raise ValueError(f"{attribute.name} must hold non-negative ids, got {negative[0]}")


@attrs.frozen(kw_only=True)
class PromptSample:
    """One prompt, formatted and tokenised, with what the reward needs to score its responses.

    ``prompt_text`` is the formatted prompt (chat template and/or input template applied) and
    ``prompt_token_ids`` its tokens, never truncated. ``label`` and ``reference`` are the row's
    values under ``label_key`` / ``reference_key`` as read from the file (``None`` when that key
    is not configured). ``metadata`` holds every other column of the row. ``source_index`` is
    the row's 0-based position in the source, before any prompt was dropped, so a reward error or
    a saved trajectory can be traced back to the file.

    A prompt with images lists where they are in ``images``, one with audio clips in ``audio``;
    its ``prompt_token_ids`` are then the model processor's expanded ids (every image or audio
    placeholder repeated once per feature the model's encoder gives for it) and ``prompt_text``
    the chat with its placeholders. ``media`` holds the decoded images and clips and the
    processor's tensors once the sample is selected from its dataset
    (:meth:`PromptDataset.select <lrft.data.PromptDataset.select>`), ``None`` before.

    ``raw_input`` is the row's value under ``input_key`` as read, before any template (a string
    or a conversation): what a multi-turn environment starts its episode from.
    """

    prompt_text: str
    prompt_token_ids: tuple[int, ...] = attrs.field(
        converter=v.int_tuple, validator=_non_empty_token_ids
    )
    label: object = None
    reference: object = None
    metadata: Mapping[str, object] = attrs.field(
        factory=lambda: MappingProxyType({}), converter=v.read_only
    )
    source_index: int = attrs.field(default=0, validator=v.non_negative_int)
    images: tuple[ImageSource, ...] = attrs.field(default=(), converter=_sources)
    audio: tuple[AudioSource, ...] = attrs.field(default=(), converter=_audio_sources)
    media: MediaInputs | None = None
    raw_input: object = None

    @property
    def prompt_length(self) -> int:
        return len(self.prompt_token_ids)


@attrs.frozen(kw_only=True)
class PromptStats:
    """What loading a prompt source kept and dropped; the trainer logs :meth:`as_metrics`.

    ``rows`` counts the rows read (after ``max_samples``), ``kept`` those that became samples.
    ``dropped_too_long`` lists the source indices of prompts longer than
    ``max_prompt_length`` tokens; ``dropped_empty`` those whose formatted prompt has no token.
    Nothing is truncated: a prompt is kept whole or dropped and listed here.
    """

    source: str
    rows: int = attrs.field(validator=v.non_negative_int)
    kept: int = attrs.field(validator=v.non_negative_int)
    max_prompt_length: int | None
    dropped_too_long: tuple[int, ...] = attrs.field(default=(), converter=v.int_tuple)
    dropped_empty: tuple[int, ...] = attrs.field(default=(), converter=v.int_tuple)
    longest_kept: int = attrs.field(default=0, validator=v.non_negative_int)

    def __attrs_post_init__(self) -> None:
        accounted = self.kept + len(self.dropped_too_long) + len(self.dropped_empty)
        if accounted != self.rows:
            raise ValueError(
                f"PromptStats does not add up: kept {self.kept} + dropped_too_long "
                f"{len(self.dropped_too_long)} + dropped_empty {len(self.dropped_empty)} "
                f"= {accounted}, but rows = {self.rows}"
            )

    @property
    def dropped(self) -> int:
        return len(self.dropped_too_long) + len(self.dropped_empty)

    def as_metrics(self, prefix: str = "data/") -> dict[str, float]:
        """Flat numbers for a metrics logger (``data/rows``, ``data/kept``, ...)."""
        return {
            f"{prefix}rows": float(self.rows),
            f"{prefix}kept": float(self.kept),
            f"{prefix}dropped_too_long": float(len(self.dropped_too_long)),
            f"{prefix}dropped_empty": float(len(self.dropped_empty)),
            f"{prefix}dropped_fraction": self.dropped / self.rows if self.rows else 0.0,
            f"{prefix}longest_kept_prompt": float(self.longest_kept),
        }

    def summary(self) -> str:
        limit = "none" if self.max_prompt_length is None else str(self.max_prompt_length)
        return (
            f"{self.source}: kept {self.kept} of {self.rows} prompts; dropped "
            f"{len(self.dropped_too_long)} longer than max_prompt_length={limit} tokens and "
            f"{len(self.dropped_empty)} empty"
        )
