"""Built-in tools: :class:`Calculator` (exact arithmetic) and :class:`PythonTool` (sandboxed)."""

from lrft.agents.tools.calculator import Calculator, CalculatorError, evaluate, format_number
from lrft.agents.tools.python import PythonTool

__all__ = ["Calculator", "CalculatorError", "PythonTool", "evaluate", "format_number"]
