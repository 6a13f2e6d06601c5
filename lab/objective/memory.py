"""Measured activation memory: peak bytes held by tensors saved for backward.

`saved_tensors_hooks` sees every tensor autograd saves. Each distinct storage is counted
once while any saved reference to it is alive; storages of Parameters (and of their views
and detached aliases, which autograd saves for every linear layer) are not counted: they
exist whatever the schedule. The peak over a step is what the backward schedule controls.
"""

from __future__ import annotations

import weakref

import torch


class _Saved:
    """Wraps a saved tensor; releases its bytes from the meter when autograd drops it."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class SavedTensorMeter:
    def __init__(self, exclude=()):
        self._excluded = {p.untyped_storage().data_ptr() for p in exclude}
        self.live_bytes = 0
        self.peak_bytes = 0
        self._refs: dict[int, int] = {}  # storage key -> number of live saved references
        self._sizes: dict[int, int] = {}

    def _pack(self, tensor: torch.Tensor):
        if isinstance(tensor, torch.nn.Parameter) or tensor.device.type == "meta":
            return tensor
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self._excluded:
            return tensor
        if self._refs.get(key, 0) == 0:
            self._sizes[key] = storage.nbytes()
            self.live_bytes += self._sizes[key]
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self._refs[key] = self._refs.get(key, 0) + 1
        holder = _Saved(tensor)
        weakref.finalize(holder, self._release, key)
        return holder

    def _release(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            self.live_bytes -= self._sizes.pop(key)
            del self._refs[key]

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    def __enter__(self):
        self.live_bytes = self.peak_bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False
