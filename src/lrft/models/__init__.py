"""Hugging Face model adapters: how lrft loads, hooks and extends transformers models.

- :mod:`~lrft.models.media`: generative models with media towers (loading, frozen towers, the
  tower kept running on text-only micro-batches, processed media into forward arguments);
- :mod:`~lrft.models.scalar_head`: a causal LM with a scalar head (critics, reward models);
- :mod:`~lrft.models.vision_critic`: a Qwen2-VL value model.
"""
