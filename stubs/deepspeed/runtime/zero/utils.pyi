from collections.abc import Iterator, Sequence

import torch

def get_mapping_to_flat_buffer(
    tensors: Sequence[torch.Tensor],
) -> Iterator[tuple[torch.Tensor, int, int]]: ...
