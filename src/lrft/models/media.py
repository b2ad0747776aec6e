"""How a transformers model takes processed media: loading it, a batch's media arguments, and
the 3-D m-RoPE positions of the Qwen2-VL family.

Both the ``hf`` engine and the trainer's forwards read a batch's media through here, so the
engine's generation and the trainer's logprobs see the same inputs and the same positions:

- :func:`media_modalities` says what a model takes (a vision tower: ``images``; an audio
  tower: ``audio``), :func:`load_generative_model` loads a folder as the model class that
  generates from its media, :func:`freeze_vision_tower` / :func:`freeze_audio_tower` stop
  training its vision tower or audio encoder;
- :class:`MediaBatch` lays out the media of a batch of rows: the rows' media tensors
  concatenated along dimension 0 (each row's :class:`~lrft.api.ProcessedMedia` in row order; a
  row without media adds nothing) and their per-token tensors placed where each row's prompt
  sits in the padded batch;
- :func:`rope_positions`: for a model with m-RoPE (``get_rope_index``: temporal, height and
  width positions for image tokens, text positions after an image continuing from the image's
  largest position), the ``(3, rows, columns)`` positions of a padded batch and each row's
  *delta*: the amount by which every token after the prompt is ahead of its index, so that a
  decoded token at index ``i`` of its sequence has position ``i + delta`` on all three axes.
  ``None`` for a model with plain positions, or a batch with no media.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from lrft.api.media import Modality, ProcessedMedia


def _config(model: torch.nn.Module) -> Any:
    inner = getattr(model, "module", model)  # a DeepSpeed engine holds the model as .module
    return getattr(inner, "config", None)


def media_modalities(model: torch.nn.Module) -> frozenset[Modality]:
    """The modalities ``model`` takes: ``images`` with a vision tower, ``audio`` with an audio
    tower (read from its config)."""
    config = _config(model)
    found: set[Modality] = set()
    if getattr(config, "vision_config", None) is not None:
        found.add("images")
    if getattr(config, "audio_config", None) is not None:
        found.add("audio")
    return frozenset(found)


# Config attributes naming a model's media placeholder ids (Qwen2-VL, LLaVA, Qwen2-Audio, ...).
_PLACEHOLDER_ATTRIBUTES = (
    "image_token_id",
    "image_token_index",
    "video_token_id",
    "audio_token_id",
    "audio_token_index",
)


def placeholder_token_ids(model: torch.nn.Module) -> tuple[int, ...]:
    """The ids that stand for media features in ``model``'s prompts (none for a model without
    media). Engines never sample them: a response holding one could not be read back, since
    the model would take it for a feature of the prompt's media."""
    if not media_modalities(model):
        return ()
    config = _config(model)
    ids = {getattr(config, name, None) for name in _PLACEHOLDER_ATTRIBUTES}
    return tuple(sorted(int(i) for i in ids if isinstance(i, int) and i >= 0))


def generative_model_class(config: Any) -> Any:
    """The transformers auto class that builds ``config``'s model as one generating text: a
    causal LM, or for a model with a vision tower its image-text-to-text class, for one with an
    audio tower its multimodal LM class."""
    if getattr(config, "vision_config", None) is not None:
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText
    if getattr(config, "audio_config", None) is not None:
        from transformers import AutoModelForMultimodalLM

        return AutoModelForMultimodalLM
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM


def load_generative_model(
    directory: str | os.PathLike[str],
    *,
    dtype: torch.dtype | str,
    attn_implementation: str | None = None,
) -> torch.nn.Module:
    """The folder's model, built by :func:`generative_model_class`, with ``attn_implementation``
    (transformers' attention kernel; ``None``: its default)."""
    from transformers import AutoConfig

    loader = generative_model_class(AutoConfig.from_pretrained(directory))
    kernel = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model: torch.nn.Module = loader.from_pretrained(directory, dtype=dtype, **kernel)
    return model


# Children of a vision tower that project its features into the language model's space: they
# keep training when the tower is frozen. Qwen2-Audio's projector (``multi_modal_projector``)
# is no child of its audio tower, so freezing the whole tower leaves it training.
_PROJECTORS = ("merger",)
_VISION_TOWERS = ("visual", "vision_tower", "vision_model")
_AUDIO_TOWERS = ("audio_tower",)


def _tower(model: torch.nn.Module, names: Sequence[str]) -> torch.nn.Module | None:
    inner = getattr(model, "module", model)
    for owner in (inner, getattr(inner, "model", None)):
        for name in names:
            tower = getattr(owner, name, None)
            if isinstance(tower, torch.nn.Module):
                return tower
    return None


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's vision tower (``model.visual`` of Qwen2-VL), or ``None`` without one."""
    return _tower(model, _VISION_TOWERS)


def audio_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's audio encoder (``model.audio_tower`` of Qwen2-Audio), or ``None``."""
    return _tower(model, _AUDIO_TOWERS)


def _freeze(tower: torch.nn.Module) -> list[str]:
    frozen = []
    for name, parameter in tower.named_parameters():
        if name.split(".", 1)[0] in _PROJECTORS:
            continue
        parameter.requires_grad_(False)
        frozen.append(name)
    return frozen


def freeze_vision_tower(model: torch.nn.Module) -> list[str]:
    """Stop training the vision tower's own weights (its projector, ``merger``, still trains);
    returns the frozen parameters' names, relative to the tower. ``ValueError`` without one."""
    tower = vision_tower(model)
    if tower is None:
        raise ValueError(f"{type(model).__name__} has no vision tower to freeze")
    return _freeze(tower)


def freeze_audio_tower(model: torch.nn.Module) -> list[str]:
    """Stop training the audio encoder's weights (the projector after it still trains);
    returns the frozen parameters' names, relative to the encoder. ``ValueError`` without one."""
    tower = audio_tower(model)
    if tower is None:
        raise ValueError(f"{type(model).__name__} has no audio tower to freeze")
    return _freeze(tower)


def idle_audio_inputs(model: torch.nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """Inputs that run a Qwen2-Audio-style encoder over one silent clip yielding no audio token
    (empty for a model without an audio tower).

    A sharded trainer (FSDP2, ZeRO-3) gathers each encoder layer's weights collectively when it
    runs, so every rank's forward must run the encoder, also over a micro-batch without audio,
    or the ranks' collectives stop matching (gloo: "Received data size doesn't match expected
    size"). One frame of mel features is one valid encoder position (no fully masked attention
    row, so no NaN) that the encoder's stride and pooling turn into 0 output tokens: nothing is
    scattered into the text, the logits are the text model's, and the encoder and projector get
    zero gradients on every rank alike."""
    config = getattr(_config(model), "audio_config", None)
    if config is None:
        return {}
    frames = 2 * int(config.max_source_positions)  # the encoder's second convolution halves them
    mask = torch.zeros((1, frames), dtype=torch.long, device=device)
    mask[0, 0] = 1
    return {
        "input_features": torch.zeros((1, int(config.num_mel_bins), frames), device=device),
        "feature_attention_mask": mask,
    }


def idle_image_inputs(model: torch.nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """``pixel_values`` and ``image_grid_thw`` of one blank image of the smallest grid a
    Qwen2-VL-style vision tower reads (one merge window: ``spatial_merge_size`` squared
    patches, one output token); empty for a model without such a tower."""
    config = getattr(_config(model), "vision_config", None)
    merge = getattr(config, "spatial_merge_size", None)
    if config is None or merge is None:
        return {}
    channels = int(getattr(config, "in_channels", getattr(config, "in_chans", 3)))
    width = channels * int(config.temporal_patch_size) * int(config.patch_size) ** 2
    return {
        "pixel_values": torch.zeros((int(merge) ** 2, width), device=device),
        "image_grid_thw": torch.tensor([[1, int(merge), int(merge)]], device=device),
    }


def keep_vision_tower_running(model: torch.nn.Module) -> bool:
    """Hook ``model`` (a Qwen2-VL-style model: ``model.language_model`` under the model or its
    ``model``) so that a forward without images runs the vision tower too; returns whether it
    was hooked (``False`` for a model without a vision tower).

    The audio encoder's counterpart, :func:`idle_audio_inputs`, works through the forward's
    arguments; Qwen2-VL refuses image features without image tokens in the text, so here a hook
    runs the tower over :func:`idle_image_inputs` just before the language model and adds the
    features x 0 to its input embeddings: the logits stay the text model's, the tower and
    projector get zero gradients, and its sharded weights are gathered in the same order as on a
    rank whose micro-batch holds images (the tower runs before the decoder layers on both)."""
    inner = getattr(model, "module", model)
    backbone = getattr(inner, "model", inner)
    language = getattr(backbone, "language_model", None)
    features = getattr(backbone, "get_image_features", None)
    if not isinstance(language, torch.nn.Module) or features is None:
        return False
    if not idle_image_inputs(model, torch.device("cpu")):
        return False
    with_images = [False]

    def note_images(_: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        # transformers' own classes pass the media by keyword
        media = (kwargs.get(name) for name in ("pixel_values", "pixel_values_videos"))
        with_images[0] = any(value is not None for value in media)

    def run_idle_tower(
        _: torch.nn.Module, args: Any, kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]] | None:
        embeds = kwargs.get("inputs_embeds")
        if with_images[0] or embeds is None:
            return None
        idle = idle_image_inputs(model, embeds.device)
        output = features(idle["pixel_values"], idle["image_grid_thw"], return_dict=True)
        pooled = output.pooler_output
        pooled = torch.cat(list(pooled)) if isinstance(pooled, list | tuple) else pooled
        kwargs["inputs_embeds"] = embeds + pooled.sum().to(embeds.dtype) * 0.0
        return args, kwargs

    backbone.register_forward_pre_hook(note_images, with_kwargs=True)
    language.register_forward_pre_hook(run_idle_tower, with_kwargs=True)
    return True


def media_patches(media: ProcessedMedia | None) -> int:
    """The positions a prompt's media encoder reads (0 without media): its largest input, in
    rows of a 2-D input (Qwen2-VL's ``pixel_values``: patches) or items x last dimension of a
    larger one (``input_features``: clips x frames); 1-D and metadata-sized inputs
    (``image_grid_thw``) are smaller than the input they describe."""
    if media is None:
        return 0
    sizes = [
        int(t.shape[0]) if t.dim() == 2 else int(t.shape[0] * t.shape[-1])
        for t in media.tensors.values()
        if t.dim() >= 2
    ]
    return max(sizes, default=0)


@attrs.frozen(kw_only=True, eq=False)
class MediaBatch:
    """The media of a padded batch: ``kwargs`` for the model's forward (empty without media)
    and, per row, its media (``None`` for a row without) and where its prompt starts."""

    rows: tuple[ProcessedMedia | None, ...]
    offsets: tuple[int, ...]
    kwargs: dict[str, torch.Tensor]

    @property
    def any(self) -> bool:
        return any(media is not None for media in self.rows)

    @classmethod
    def build(
        cls,
        rows: Sequence[ProcessedMedia | None],
        *,
        offsets: Sequence[int],
        width: int,
        device: torch.device,
    ) -> MediaBatch:
        """``rows``' media; row ``i``'s prompt occupies columns ``offsets[i]`` onwards of a
        batch ``width`` columns wide (left padding: the prompt ends at the last column)."""
        present = [media for media in rows if media is not None]
        kwargs: dict[str, torch.Tensor] = {}
        if present:
            names = set(present[0].tensors)
            for media in present[1:]:
                if set(media.tensors) != names:
                    raise ValueError(
                        f"rows of one batch carry different media tensors: "
                        f"{sorted(names)} and {sorted(media.tensors)}"
                    )
            for name in sorted(names):
                kwargs[name] = torch.cat([media.tensors[name] for media in present]).to(device)
            kwargs.update(_token_tensors(rows, offsets, width, device))
        return cls(rows=tuple(rows), offsets=tuple(offsets), kwargs=kwargs)


def _token_tensors(
    rows: Sequence[ProcessedMedia | None],
    offsets: Sequence[int],
    width: int,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    first: dict[str, torch.Tensor] = {}
    for media in rows:
        for name, values in ({} if media is None else media.token_tensors).items():
            first.setdefault(name, values)
    laid: dict[str, torch.Tensor] = {}
    for name, example in first.items():
        grid = torch.zeros((len(rows), width), dtype=example.dtype)
        for row, (media, offset) in enumerate(zip(rows, offsets, strict=True)):
            if media is not None and name in media.token_tensors:
                values = media.token_tensors[name]
                grid[row, offset : offset + values.shape[0]] = values
        laid[name] = grid.to(device)
    return laid


def _rope_index(model: torch.nn.Module) -> Callable[..., Any] | None:
    inner = getattr(model, "module", model)
    for owner in (inner, getattr(inner, "model", None)):
        function: Callable[..., Any] | None = getattr(owner, "get_rope_index", None)
        if callable(function):
            return function
    return None


def has_mrope(model: torch.nn.Module) -> bool:
    """Whether ``model`` places tokens by m-RoPE (``get_rope_index``)."""
    return _rope_index(model) is not None


def rope_positions(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    media: MediaBatch,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(positions (3, rows, columns), deltas (rows,))`` of a padded batch for an m-RoPE
    model, from the model's own ``get_rope_index`` (see module); ``None`` for a model with
    plain positions or a batch with no media (whose m-RoPE positions are plain)."""
    function = _rope_index(model)
    if function is None or not media.any:
        return None
    accepted = inspect.signature(function).parameters
    arguments = {name: value for name, value in media.kwargs.items() if name in accepted}
    positions, deltas = function(input_ids=input_ids, attention_mask=attention_mask, **arguments)
    return positions, deltas.reshape(-1)
