"""lrft's optional dependencies: the line that installs each extra, and whether a package of it
is installed (looked up, never imported: importing vllm or wandb takes seconds).

Settings checks, the run toolkit and the backends name these lines in their errors, so a missing
package is always reported with the exact command that installs it.
"""

from __future__ import annotations

import importlib.util

PLOTS_EXTRA = "pip install 'lrft[plots]'"
WANDB_EXTRA = "pip install 'lrft[wandb]'"
VLLM_EXTRA = "pip install 'lrft[vllm]'"
LORA_EXTRA = "pip install 'lrft[lora]'"
REWARDS_EXTRA = "pip install 'lrft[rewards]'"


def installed(package: str) -> bool:
    """Whether the top-level module ``package`` can be imported, without importing it."""
    return importlib.util.find_spec(package) is not None


def tensorboard_available() -> bool:
    return installed("tensorboard")


def matplotlib_available() -> bool:
    return installed("matplotlib")


def wandb_available() -> bool:
    return installed("wandb")


def vllm_available() -> bool:
    return installed("vllm")


def peft_available() -> bool:
    return installed("peft")


def httpx_available() -> bool:
    return installed("httpx")


def math_verify_available() -> bool:
    """Whether ``--reward_fn math``'s verifier is installed (the ``rewards`` extra)."""
    return installed("math_verify")
