"""``lrft eval``: greedy accuracy, pass@k and mean@n of a model folder or a checkpoint on a
prompt set, with any reward, overall and by label, on every rank under torchrun
(:mod:`lrft.eval.run`; the metrics in :mod:`lrft.eval.metrics`)."""

from lrft.eval.metrics import PromptResult, by_label, pass_at_k, summarize, table
from lrft.eval.run import EvalSettings, ModelSource, resolve_model, run_eval

__all__ = [
    "EvalSettings",
    "ModelSource",
    "PromptResult",
    "by_label",
    "pass_at_k",
    "resolve_model",
    "run_eval",
    "summarize",
    "table",
]
