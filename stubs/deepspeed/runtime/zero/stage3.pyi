import torch
from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

class DeepSpeedZeroOptimizer_Stage3:
    # the wrapped torch optimizer, stepping the flat fp32 partitions
    optimizer: torch.optim.Optimizer
    # this rank's flat fp32 master partition, one per sub-group
    fp32_partitioned_groups_flat: list[torch.Tensor]
    offloaded_states: set[OffloadStateTypeEnum]
    # per sub-group, this rank's reduced gradient partitions (None once step() used them)
    averaged_gradients: dict[int, list[torch.Tensor] | None]
    # the trained parameters' partitions, one flat buffer (their ds_tensors are views of it)
    lp_param_buffer: torch.Tensor
    fp16_partitioned_groups_flat: list[torch.Tensor]
    def independent_gradient_partition_epilogue(self) -> None: ...
    def _get_parameter_partitions(self) -> list[torch.Tensor]: ...
