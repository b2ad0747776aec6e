"""The calculator demo: ``lrft train --demo calculator`` trains a tiny model to call a calculator
tool on 3-digit sums, which it cannot do in its head, with multi-turn episodes (the
``tool_calls`` environment) and the exact-answer rule reward.

The shipped model (:data:`ASSETS_DIR`) is the addition demo's model after a short supervised
warm-up (``scripts/make_calculator_demo.py``) that showed it the calculator's call syntax:
it calls on some problems, answers the others in its head (mostly wrong), and RL finds out that
calling pays. docs/multi-turn.md "Demo" has the figures.
"""

from lrft.demos.calculator.settings import (
    ASSETS_DIR,
    CALCULATOR_DEMO_SETTINGS,
    CALCULATOR_TASK,
    calculator_demo_config,
)

__all__ = ["ASSETS_DIR", "CALCULATOR_DEMO_SETTINGS", "CALCULATOR_TASK", "calculator_demo_config"]
