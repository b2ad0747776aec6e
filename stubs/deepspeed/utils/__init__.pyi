import torch

# The full (gathered) gradient of one parameter, collective under ZeRO-3; None without one.
def safe_get_full_grad(param: torch.nn.Parameter) -> torch.Tensor | None: ...
