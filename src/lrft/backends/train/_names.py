"""The Hugging Face names of a wrapped model's parameters, which both train backends give in
``full_weights`` and checkpoints."""

from __future__ import annotations

# Segments that wrappers insert into parameter names (torch.compile, activation checkpointing,
# FSDP1); fully_shard itself keeps the original names.
_WRAPPER_SEGMENTS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


def hf_name(name: str) -> str:
    """``name`` without the segments wrapper modules add, i.e. the Hugging Face name."""
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name
