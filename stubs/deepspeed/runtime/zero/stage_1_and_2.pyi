import torch
from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

class DeepSpeedZeroOptimizer:
    # the wrapped torch optimizer, stepping the flat fp32 partitions
    optimizer: torch.optim.Optimizer
    # this rank's flat fp32 master partition, one per parameter group
    single_partition_of_fp32_groups: list[torch.Tensor]
    offloaded_states: set[OffloadStateTypeEnum]
    # per parameter group, this rank's reduced gradient partitions (None once step() used them)
    averaged_gradients: dict[int, list[torch.Tensor] | None]
