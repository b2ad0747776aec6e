"""Where an in-process engine's weights live: one flat buffer, and where it goes while asleep.

The weights are views into one :class:`~lrft.kernels.DigestBuffer`, each at a row-aligned
offset, so that fingerprinting them is one reduction over the buffer in place (no staging copy)
and parking or restoring them is one copy of the whole buffer instead of one per parameter.
Every move replaces the parameters' data and keeps the Parameter objects, so the model (and any
compiled or captured decode step) keeps its references to them.

Moving the weights changes their addresses (a CUDA-graph decode loop notices and captures again)
but not their shapes, dtypes, strides or devices once awake, which is all a compiled decode step
guards on: it is not recompiled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from lrft.kernels import DigestBuffer


class FlatWeights:
    """The parameters of one engine, held as the :attr:`DigestBuffer.views` of one buffer.

    Construction copies each parameter's data into its view (one fused copy) and points the
    parameter at the view, which frees the storage the model had (while the model holds no other
    reference to it). ``params`` lists each weight once (a tied weight is one Parameter).
    """

    def __init__(self, params: Mapping[str, torch.nn.Parameter], device: torch.device) -> None:
        self.device = device
        self._names = list(params)
        self._index = {name: i for i, name in enumerate(self._names)}
        self._params = list(params.values())
        self._specs = [(tuple(p.shape), p.dtype) for p in self._params]
        buffer = DigestBuffer(self._specs, device)
        with torch.no_grad():
            torch._foreach_copy_(buffer.views, [p.data for p in self._params])
        self._resident: DigestBuffer | None = buffer
        self._parked: DigestBuffer | None = None
        self._point_at(buffer)

    @property
    def buffer(self) -> DigestBuffer:
        """The device buffer the parameters are views of (only while they are on the device)."""
        if self._resident is None:
            raise RuntimeError("the engine's weights are not on its device (parked or released)")
        return self._resident

    @property
    def parked(self) -> bool:
        """Whether :meth:`park` moved the weights to host memory (and nothing undid it)."""
        return self._parked is not None

    def sums(self) -> torch.Tensor:
        """The fingerprint sums of every parameter, in the order of ``params``, on the device."""
        return self.buffer.sums()

    # The engine's ``WeightStore``: a sync writes into the views the parameters are.

    def storage(self, names: list[str]) -> list[torch.Tensor]:
        """The device views the named parameters are, to be written in place."""
        views = self.buffer.views
        if names == self._names:  # a sync lends every weight at once, in the digest order
            return list(views)
        return list(map(views.__getitem__, map(self._index.__getitem__, names)))

    def digest_order(self) -> Sequence[str]:
        return self._names

    def digest_sums(self) -> torch.Tensor:
        return self.sums()

    def park(self) -> None:
        """Level 1: the whole buffer to host memory (pinned where the device is CUDA) in one
        copy; the parameters then point into the host buffer and the device buffer is freed."""
        host = DigestBuffer(self._specs, "cpu", pin_memory=self.device.type == "cuda")
        host.copy_from(self.buffer)
        self._point_at(host)
        self._parked, self._resident = host, None

    def restore(self) -> None:
        """Back from :meth:`park`: one copy into a new device buffer (new addresses)."""
        if self._parked is None:
            raise RuntimeError("restore() without park(): no weights are parked")
        buffer = DigestBuffer(self._specs, self.device)
        buffer.copy_from(self._parked)
        self._point_at(buffer)
        self._resident, self._parked = buffer, None

    def release(self) -> None:
        """Level 2: drop the weights, wherever they are; each parameter becomes an empty tensor
        (the shapes stay in the specs)."""
        for parameter in self._params:
            # Replacing the data drops the last views of the buffers, which frees them.
            parameter.data = torch.empty(0, dtype=parameter.dtype, device=self.device)
        self._resident = self._parked = None

    def allocate(self) -> None:
        """Back from :meth:`release`: a new, uninitialised device buffer."""
        buffer = DigestBuffer(self._specs, self.device)
        self._point_at(buffer)
        self._resident, self._parked = buffer, None

    def _point_at(self, buffer: DigestBuffer) -> None:
        for parameter, view in zip(self._params, buffer.views, strict=True):
            parameter.data = view
