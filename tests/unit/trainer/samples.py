"""Random packed samples for the trainer's update tests."""

from __future__ import annotations

import torch

from lrft.api.types import GenerationResult
from lrft.trainer.sequences import Sequences, pack


def random_responses(rows: int, generator: torch.Generator) -> Sequences:
    """``rows`` samples, packed: responses of 1 to 9 tokens after prompts of 1 to 4, token ids
    in [3, 256), all drawn from ``generator``."""
    results = []
    for row in range(rows):
        prompt_length = int(torch.randint(1, 5, (), generator=generator))
        output_length = int(torch.randint(1, 10, (), generator=generator))
        prompt = torch.randint(3, 256, (prompt_length,), generator=generator)
        output = torch.randint(3, 256, (output_length,), generator=generator)
        results.append(
            GenerationResult(
                request_id=str(row),
                sample_index=0,
                prompt_token_ids=prompt.tolist(),
                output_token_ids=output.tolist(),
                finish_reason="length",
            )
        )
    return pack(results)
