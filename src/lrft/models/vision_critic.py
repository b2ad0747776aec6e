"""The PPO critic of a Qwen2-VL actor: the whole backbone (vision tower, projector, language model)
with a one-output ``score`` head per token.

transformers has no token-classification form of Qwen2-VL, which is what the text critic is
(:mod:`lrft.trainer.critic`). This class is that form: its weights are named as the text
critic's (the backbone under ``model.``, the head ``score``), so a Qwen2-VL checkpoint loads into
it with only the head new (its ``lm_head`` is not used), and the critic sees each row's images
through the same inputs as the actor (:func:`lrft.trainer.sequences.forward_inputs`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen2VLConfig, Qwen2VLModel
from transformers.modeling_outputs import TokenClassifierOutput
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLPreTrainedModel

VISION_CRITIC_TYPES = ("qwen2_vl",)
"""The model types whose critic this module builds."""


class Qwen2VLForValues(Qwen2VLPreTrainedModel):  # type: ignore[no-untyped-call]  # transformers' __init_subclass__ is unannotated
    """A Qwen2-VL backbone and a ``Linear(hidden, 1)`` value head on every token."""

    def __init__(self, config: Qwen2VLConfig) -> None:
        super().__init__(config)
        self.model = Qwen2VLModel(config)
        text: Any = config.text_config  # a Qwen2VLTextConfig once the config is built
        self.score = torch.nn.Linear(text.hidden_size, 1)
        self.post_init()  # type: ignore[no-untyped-call]  # unannotated in transformers

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> TokenClassifierOutput:
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return TokenClassifierOutput(logits=self.score(outputs.last_hidden_state))


def _register_checkpoint_layout() -> None:
    """Load Qwen2-VL checkpoints as ``Qwen2VLForConditionalGeneration`` does. transformers 5.24
    renames a checkpoint's keys (``model.layers.*`` to ``model.language_model.layers.*``,
    ``visual.*`` to ``model.visual.*``) by the loading class's name, and applies no renaming to
    a class defined outside it unless that class is registered."""
    from transformers import conversion_mapping

    name = Qwen2VLForValues.__name__
    mapping = conversion_mapping.get_checkpoint_conversion_mapping(  # type: ignore[no-untyped-call]  # unannotated in transformers
        "Qwen2VLForConditionalGeneration"
    )
    conversion_mapping.register_checkpoint_conversion_mapping(
        name, list(mapping or []), overwrite=True
    )


_register_checkpoint_layout()
