"""Kernel launches over fixed addresses, replayed from a CUDA graph.

A weight sync launches the same few kernels over the same tables and tensors sync after sync.
On a slow host each launch costs tens of microseconds, more than a small bucket's copy, so from
the second call on the launches are captured once into a CUDA graph, and a replay costs one
launch. The first call runs eagerly: it compiles and loads the kernels, which may not happen
during a capture.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE


class Replay:
    """Calls ``launch`` on ``device``: eagerly at first, then from a CUDA graph.

    ``launch`` must only enqueue device work over addresses that stay valid and unchanged for
    the life of this object (the graph keeps them), without a host sync or anything that
    reads device values on the host; temporaries it allocates come from the graph's own memory
    pool, kept while the graph lives. Anything but CUDA always runs eagerly. A first call that
    synchronises with the host, or a capture that fails (an operation a graph cannot hold),
    leaves the launches eager for good: the first is never captured at all, because a failed
    capture can leave torch's caching allocator believing a capture is still under way, after
    which ``empty_cache`` releases nothing for the rest of the process (measured with torch
    2.11: an engine's sleep then freed none of its memory).
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
        elif self._eager:
            self._launch()
        elif self._calls == 0:
            self._eager = _synchronizes(self._launch)
        else:
            self._graph = self._capture()
            if self._graph is None:
                self._launch()
            else:
                self._graph.replay()
        self._calls += 1

    def _capture(self) -> torch.cuda.CUDAGraph | None:
        graph = torch.cuda.CUDAGraph()
        pool = torch.cuda.graph_pool_handle()
        current = torch.cuda.current_stream(self._device)
        # Capture needs a stream other than the default one; it runs nothing, and the replay
        # then runs on the caller's stream, after what the caller queued there.
        side = torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]  # unannotated in torch
        side.wait_stream(current)
        try:
            with torch.cuda.stream(side):
                # thread_local: other threads (a process group's watchdog) may go on calling
                # CUDA while this thread captures.
                graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                try:
                    self._launch()
                finally:
                    graph.capture_end()
        except RuntimeError:
            self._eager = True
            _end_routing_to_pool(pool, self._device)
            return None
        finally:
            current.wait_stream(side)
        return graph


def _synchronizes(launch: Callable[[], None]) -> bool:
    """Run ``launch`` once and say whether it synchronised with the host (torch's sync debug
    mode warns of every synchronising operation; it runs to the end either way)."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            launch()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return any("synchroniz" in str(warning.message) for warning in caught)


def _end_routing_to_pool(pool: _POOL_HANDLE, device: torch.device) -> None:
    """After a failed capture: tell the caching allocator that nothing routes into ``pool`` any
    more. Some torch releases (2.11 among them, as far as measured) raise from ``capture_end``
    on an invalidated capture before they end that routing themselves; where torch ended it, the
    allocator refuses to end it again, and there is nothing to do."""
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end is None:
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    with contextlib.suppress(RuntimeError):
        end(index, pool)
