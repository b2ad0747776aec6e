from collections.abc import Mapping
from typing import Any

from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

class _PrecisionConfig:
    enabled: bool

# DeepSpeed's parsed config; lrft's tests read back what DeepSpeed understood of a generated dict.
class DeepSpeedConfig:
    def __init__(self, config: Mapping[str, Any] | str, mpu: object = None) -> None: ...
    zero_optimization_stage: int
    zero_config: DeepSpeedZeroConfig
    gradient_clipping: float
    gradient_accumulation_steps: int
    managed_gradient_accumulation: bool
    bfloat16_config: _PrecisionConfig
