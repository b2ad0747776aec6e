"""The math-verify worker: parses and compares answers in a process of its own.

It is run as a script (``python -P <this file> <memory limit>``), never imported by lrft, so it
imports only the standard library and ``math_verify``: no torch, and a start-up of a few tenths
of a second. Requests and replies are JSON lines on stdin/stdout.

Request: ``{"gold": str, "answer": str, "float_rounding": int, "numeric_precision": int,
"strict": bool}`` (answers as extracted, without ``\\boxed``). Reply: ``{"gold_parsed": bool,
"answer_parsed": bool, "correct": bool}``, or ``{"error": str, "stage": "gold" | "answer"}``
when parsing the gold answer, or parsing or comparing the model's answer, raised.

The parent enforces the time limit by killing this process, which also stops work stuck in C code
that a signal-based timeout (math-verify's own) would not interrupt; math-verify's timeouts are
therefore off here.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
from typing import Any


def _judge(request: dict[str, Any]) -> dict[str, Any]:
    # math-verify 0.9 ships no type information; its results stay Any inside this function.
    from math_verify import (  # type: ignore[import-untyped]  # math-verify ships no type information
        ExprExtractionConfig,
        LatexExtractionConfig,
        parse,
        verify,
    )

    targets = [LatexExtractionConfig(), ExprExtractionConfig()]

    def parsed(answer: str) -> list[Any]:
        # Wrapped in \boxed{} so that math-verify reads the whole extracted answer as one
        # expression, whatever '$' it contains; no fallback, so "could not parse" is an empty list.
        result: list[Any] = parse(
            "\\boxed{" + answer + "}",
            extraction_config=targets,
            fallback_mode="no_fallback",
            parsing_timeout=None,
        )
        return result

    stage = "gold"
    try:
        gold = parsed(request["gold"])
        stage = "answer"
        answer = parsed(request["answer"])
        correct = bool(gold and answer) and verify(
            gold,
            answer,
            float_rounding=request["float_rounding"],
            numeric_precision=request["numeric_precision"],
            strict=request["strict"],
            timeout_seconds=None,
        )
    except Exception as error:
        # Only the type: printing a huge sympy number in the message could itself hang.
        return {"error": type(error).__name__, "stage": stage}
    return {"gold_parsed": bool(gold), "answer_parsed": bool(answer), "correct": bool(correct)}


def main() -> None:
    memory_limit = int(sys.argv[1])
    if memory_limit > 0:
        # A pathological power such as 9^{9^{9}} asks sympy for a number of hundreds of MB; the
        # limit turns that into a MemoryError here instead of memory taken from the rank.
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints from libraries go to stderr, never into the reply stream
    sys.stdout = sys.stderr
    # math-verify warns once that its timeouts are off; they are, on purpose (see above).
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401  (imported before "ready" so the first request is fast)

    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin:
        reply = _judge(json.loads(line))
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
