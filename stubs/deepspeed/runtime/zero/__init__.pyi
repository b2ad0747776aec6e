# deepspeed.zero is this package (deepspeed/__init__.py imports it under that name).
from collections.abc import Iterable
from types import TracebackType

import torch

class GatheredParameters:
    def __init__(
        self,
        params: torch.nn.Parameter | Iterable[torch.nn.Parameter],
        modifier_rank: int | None = None,
        fwd_module: torch.nn.Module | None = None,
        enabled: bool = True,
    ) -> None: ...
    def __enter__(self) -> None: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...
