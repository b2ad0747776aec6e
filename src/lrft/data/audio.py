"""A row's audio clips: where each comes from, and reading one with an error that names it.

A row's ``audios_key`` column holds one clip or a list of them, each as:

- a path (a string) to a sound file (WAV, FLAC, OGG, ...: whatever libsndfile reads): absolute,
  or relative to the folder of the data file (a ``datasets`` folder: relative to that folder);
- bytes of an encoded sound file (a Parquet binary column);
- a ``{"bytes": ..., "path": ...}`` record, as ``datasets``' ``Audio`` feature stores a clip
  (in its Parquet files and ``save_to_disk`` folders): the bytes when present, else the path.

:func:`read_audio` decodes one with ``soundfile`` (libsndfile; the ``audio`` extra), averages
its channels to mono, refuses one longer than the model's feature-extractor window (the
extractor would silently cut it) and resamples it to the extractor's rate with ``soxr``
(its default "high quality" band-limited resampler, the one librosa uses) when the file has
another rate. Every error names the row, the data file and the clip.
"""

from __future__ import annotations

import io
from pathlib import Path

import attrs
import torch

from lrft.api.media import AudioClip
from lrft.data.errors import PromptDataError
from lrft.data.located import LocatedSource, locate_encoded, row_sources
from lrft.data.sources import import_optional

AUDIO_MARKER = "<audio>"
"""Marks where a clip goes in a string input or a message's string content."""


@attrs.frozen(kw_only=True, eq=False)
class AudioSource(LocatedSource):
    """Where one clip of a row comes from: exactly one of ``path`` or ``data``."""


def audio_sources(value: object, *, base: Path, where: str, key: str) -> tuple[AudioSource, ...]:
    """The clips of a row's ``key`` column (one item or a list; ``None`` is no clip)."""
    return row_sources(value, key=key, where=where, locate=lambda item, at: _source(item, base, at))


def _source(item: object, base: Path, where: str) -> AudioSource:
    found = locate_encoded(item, base=base, where=where, noun="audio", make=AudioSource)
    if found is not None:
        return found
    raise PromptDataError(
        f"{where}: an audio clip must be a path, bytes or a {{'bytes', 'path'}} record, "
        f"got {type(item).__name__} ({item!r:.60})"
    )


def read_audio(
    source: AudioSource, *, sampling_rate: int, max_seconds: float | None, where: str
) -> AudioClip:
    """``source`` decoded, mono, at ``sampling_rate``; ``PromptDataError`` naming it when it is
    missing, unreadable, empty or longer than ``max_seconds`` (``where`` names the row)."""
    soundfile = import_optional("soundfile", "soundfile", "reading audio files", extra="audio")
    if source.item:
        where = f"{where}, {source.item}"
    if source.path is not None and not source.path.is_file():
        raise PromptDataError(f"{where}: audio {source.describe()} does not exist")
    try:
        samples, rate = soundfile.read(
            source.path if source.path is not None else io.BytesIO(source.data or b""),
            dtype="float32",
            always_2d=True,
        )
    # libsndfile's errors are LibsndfileError (a RuntimeError); a file it cannot even open
    # as a sound file raises the same, a truncated one too.
    except (RuntimeError, OSError, ValueError) as error:
        raise PromptDataError(
            f"{where}: audio {source.describe()} is not a readable sound file ({error})"
        ) from error
    if samples.shape[0] == 0:
        raise PromptDataError(f"{where}: audio {source.describe()} holds no samples")
    seconds = samples.shape[0] / rate
    if max_seconds is not None and seconds > max_seconds:
        raise PromptDataError(
            f"{where}: audio {source.describe()} lasts {seconds:.3f} s, longer than the model's "
            f"feature-extractor window of {max_seconds:g} s (the rest would be cut off)"
        )
    mono = samples.mean(axis=1)
    if rate != sampling_rate:
        soxr = import_optional("soxr", "soxr", "resampling audio", extra="audio")
        mono = soxr.resample(mono, rate, sampling_rate)
    return AudioClip(waveform=torch.from_numpy(mono.copy()).float(), sampling_rate=sampling_rate)
