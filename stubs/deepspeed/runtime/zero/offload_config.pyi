from enum import Enum

class OffloadDeviceEnum(str, Enum):  # noqa: UP042 (as DeepSpeed declares it)
    none = "none"
    cpu = "cpu"
    nvme = "nvme"

class OffloadStateTypeEnum(str, Enum):  # noqa: UP042 (as DeepSpeed declares it)
    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"
