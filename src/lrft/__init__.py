"""lrft: typed reinforcement fine-tuning on torchrun.

Importing :mod:`lrft` is cheap: it never imports deepspeed, vllm or sglang. The typed contracts
live in :mod:`lrft.api`, the distributed primitives in :mod:`lrft.dist`, the backends in
:mod:`lrft.backends` and the conformance suites in :mod:`lrft.testing`.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
