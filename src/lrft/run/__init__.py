"""The run toolkit that ``lrft train``, ``train-rm``, ``eval`` and ``bench`` share.

- :mod:`~lrft.run.outputs`: the folders a run owns, claimed before it writes;
- :mod:`~lrft.run.checkpoint`, :mod:`~lrft.run.resume`: atomic checkpoints, and what a resume may
  change;
- :mod:`~lrft.run.metrics`, :mod:`~lrft.run.wandb_metrics`, :mod:`~lrft.run.progress`: JSONL,
  TensorBoard and W&B records, curves, the console;
- :mod:`~lrft.run.export`: the trained model as a Hugging Face folder.
"""
