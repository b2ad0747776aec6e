"""Kernel launches over fixed addresses, replayed from a CUDA graph.

A weight sync launches the same few kernels over the same tables and tensors sync after sync.
On a slow host each launch costs tens of microseconds, more than a small bucket's copy, so from
the second call on the launches are captured once into a CUDA graph, and a replay costs one
launch. The first call runs eagerly: it compiles and loads the kernels, which may not happen
during a capture.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class Replay:
    """Calls ``launch`` on ``device``: eagerly at first, then from a CUDA graph.

    ``launch`` must only enqueue device work over addresses that stay valid and unchanged for
    the life of this object (the graph keeps them), without a host sync or anything that
    reads device values on the host; temporaries it allocates come from the graph's own memory
    pool, kept while the graph lives. Anything but CUDA always runs eagerly. A capture that
    fails (an operation a graph cannot hold) leaves the launches eager for good.
    """

    def __init__(self, launch: Callable[[], None], device: torch.device) -> None:
        self._launch = launch
        self._device = device
        self._graph: torch.cuda.CUDAGraph | None = None
        self._eager = device.type != "cuda"
        self._calls = 0

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def __call__(self) -> None:
        if self._graph is not None:
            self._graph.replay()
        elif self._eager or self._calls == 0:
            self._launch()
        else:
            self._graph = self._capture()
            if self._graph is None:
                self._launch()
            else:
                self._graph.replay()
        self._calls += 1

    def _capture(self) -> torch.cuda.CUDAGraph | None:
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self._device)
        # Capture needs a stream other than the default one; it runs nothing, and the replay
        # then runs on the caller's stream, after what the caller queued there.
        side = torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]  # unannotated in torch
        side.wait_stream(current)
        try:
            with torch.cuda.stream(side):
                # thread_local: other threads (a process group's watchdog) may go on calling
                # CUDA while this thread captures.
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    self._launch()
                finally:
                    graph.capture_end()
        except RuntimeError:
            self._eager = True
            return None
        finally:
            current.wait_stream(side)
        return graph
