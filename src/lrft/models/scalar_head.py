"""A transformers model with a one-output linear head on a causal-LM backbone: PPO's critic (a
token-classification model, one value per position) and ``lrft train-rm``'s scalar reward model (a
sequence-classification model, one score per sequence) load the same way."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel

from lrft.api.errors import ConfigError


def init_value_head(head: torch.nn.Linear, seed: int) -> None:
    """Deterministic small weights and a zero bias: the same on every rank whatever the global RNG
    did before, and values near 0 at the start with a gradient that reaches the backbone."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight = torch.randn(head.weight.shape, generator=generator, dtype=torch.float64)
        head.weight.copy_(weight / (head.in_features + 1))
        if head.bias is not None:
            head.bias.zero_()


TRANSFORMERS_LOAD_LOGGER = "transformers.modeling_utils"
"""The logger transformers 5 writes its weight-loading report to (a warning whose first line is
``<class> LOAD REPORT``)."""


class _HeldLoadReports(logging.Filter):
    """Holds back transformers' load reports, to be shown or dropped once the load is judged."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in record.getMessage():
            self.held.append(record)
            return False
        return True


@contextlib.contextmanager
def _load_reports_held() -> Iterator[_HeldLoadReports]:
    logger = logging.getLogger(TRANSFORMERS_LOAD_LOGGER)
    held = _HeldLoadReports()
    logger.addFilter(held)
    try:
        yield held
    finally:
        logger.removeFilter(held)


def load_with_scalar_head(
    auto_class: Any,
    path: str | Path,
    config: PretrainedConfig,
    *,
    dtype: torch.dtype,
    head_name: str,
    flag: str,
    form: str,
    purpose: str,
    seed: int,
    attn_implementation: str | None = None,
    announce: Callable[[str], None] | None = None,
) -> PreTrainedModel:
    """``auto_class.from_pretrained(path)`` whose head ``head_name`` is one-output linear: its
    backbone's weights must all load; a head the folder lacks starts from
    :func:`init_value_head`. ``flag`` (the option that named the folder), ``form``
    (``"token-classification"``) and ``purpose`` (``"the value head"``) word the errors;
    ``attn_implementation`` is transformers' attention kernel (``None``: its default).

    A new head is by design, so transformers' load report listing it as MISSING is dropped, and
    ``announce`` (when given) gets one line saying the head is new; a report that lists anything
    else is shown as transformers wrote it."""
    info: dict[str, Any]
    try:
        with _load_reports_held() as reports:
            model, info = auto_class.from_pretrained(
                path,
                config=config,
                dtype=dtype,
                output_loading_info=True,
                attn_implementation=attn_implementation,
            )
    except ValueError as error:
        raise ConfigError(
            f"{flag} {str(path)!r}: a {config.model_type!r} model has no {form} form in "
            f"transformers to carry {purpose} ({error})"
        ) from error
    head = getattr(model, head_name, None)
    if not isinstance(head, torch.nn.Linear) or head.out_features != 1:
        raise ConfigError(
            f"{flag} {str(path)!r}: {type(model).__name__} has no one-output linear "
            f"'{head_name}' head"
        )
    missing = set(info["missing_keys"])
    head_names = {f"{head_name}.{name}" for name, _ in head.named_parameters()}
    backbone_missing = sorted(missing - head_names)
    if backbone_missing:
        raise ConfigError(
            f"{flag} {str(path)!r} lacks backbone weights {backbone_missing[:5]} "
            f"({len(backbone_missing)} missing)"
        )
    # A causal LM's output layer has no place in a head model: dropping it is by design too.
    unexpected = {k for k in info["unexpected_keys"] if not k.startswith("lm_head.")}
    expected = missing <= head_names and not unexpected and not info["mismatched_keys"]
    for record in [] if expected else reports.held:
        logging.getLogger(TRANSFORMERS_LOAD_LOGGER).handle(record)
    if missing & head_names:
        init_value_head(head, seed)
        if announce is not None:
            announce(
                f"{purpose} is new ({flag} {str(path)!r} has none): its weights start small, "
                f"from seed {seed}; every backbone weight loaded"
            )
    loaded: PreTrainedModel = model
    return loaded
