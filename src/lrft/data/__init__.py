"""Prompt data: local sources, prompt formatting, tokenisation, and a resumable sampler.

- :func:`load_prompt_dataset` reads a local JSONL / JSON / Parquet file or a ``save_to_disk``
  folder (:class:`PromptDataConfig`, with LightRFT's ``input_key`` / ``label_key`` names),
  formats each prompt (:class:`PromptFormat`: chat template, system prompt, input template),
  tokenises it, and drops prompts over ``max_prompt_length`` — counted in :class:`PromptStats`,
  never truncated;
- :class:`DistributedPromptSampler` gives each rank its share of each global batch and resumes
  exactly from :meth:`~DistributedPromptSampler.state_dict`; :func:`eval_indices` shards an
  evaluation set so that every prompt is scored exactly once.

``pyarrow`` and ``datasets`` are imported only when a Parquet file or a ``datasets`` folder is
read; Pillow only when an image is.

Prompts with images (``images_key``) or audio clips (``audios_key``) are formatted by the
model's own processor (:class:`MediaProcessor`, :func:`load_processor`): :mod:`lrft.data.images`
and :mod:`lrft.data.audio` read them (soundfile and soxr, the ``audio`` extra, only when a clip
is read), :mod:`lrft.data.media` places them in the chat and gives selected samples their media.
"""

from lrft.data.audio import AudioSource
from lrft.data.dataset import PromptDataConfig, PromptDataset, load_prompt_dataset
from lrft.data.errors import PromptDataError
from lrft.data.formatting import InputTemplate, PromptFormat, format_prompt
from lrft.data.images import ImageSource
from lrft.data.media import MediaLoader
from lrft.data.processor import MediaProcessor, load_processor
from lrft.data.sampler import (
    DistributedPromptSampler,
    SamplerBatch,
    SamplerPosition,
    eval_indices,
)
from lrft.data.sources import RowSource, SourceRow, read_rows
from lrft.data.types import PromptSample, PromptStats

__all__ = [
    "AudioSource",
    "DistributedPromptSampler",
    "ImageSource",
    "InputTemplate",
    "MediaLoader",
    "MediaProcessor",
    "PromptDataConfig",
    "PromptDataError",
    "PromptDataset",
    "PromptFormat",
    "PromptSample",
    "PromptStats",
    "RowSource",
    "SamplerBatch",
    "SamplerPosition",
    "SourceRow",
    "eval_indices",
    "format_prompt",
    "load_processor",
    "load_prompt_dataset",
    "read_rows",
]
