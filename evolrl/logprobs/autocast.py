"""Autocast as the passes read it, on any device.

Only some device types have autocast; asking about it on another one (the meta device, where a pass runs without
data: ``tests/test_host_syncs.py``) raises. There it is simply off.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """Autocast's dtype where it is on for ``device_type``, else ``None``."""
    if device_type in AUTOCAST_DEVICES and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def autocast_off(device_type: str) -> AbstractContextManager:
    """A block without autocast on ``device_type``."""
    return torch.autocast(device_type, enabled=False) if device_type in AUTOCAST_DEVICES else nullcontext()
