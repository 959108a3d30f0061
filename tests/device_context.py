"""The tests' default-device context (imported by ``tests/conftest.py`` and ``tests/test_testing.py``; a module of
its own name, so that ``torch.compile``, which may trace the mode, finds its globals)."""

from __future__ import annotations

from torch.utils._device import DeviceContext, _device_constructors


class TestDevice(DeviceContext):
    """``with torch.device(device)`` for tests that run on whichever device the machine has: factory calls without
    a device make their tensors on ``device``, except calls drawing from a generator (a seeded CPU
    ``torch.Generator``), which draw on the generator's device as they would outside the context: a test's seeded
    data are the same numbers on a CPU machine and on a GPU machine, and it moves them itself. ``torch.compile``
    treats it as a default-device context (a ``DeviceContext``)."""

    __test__ = False  # not a pytest test class

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        gen = kwargs.get("generator")  # (traced code has none: then only DeviceContext's own logic runs)
        if gen is not None and kwargs.get("device") is None and func in _device_constructors():
            kwargs["device"] = gen.device
        return super().__torch_function__(func, types, args, kwargs)
