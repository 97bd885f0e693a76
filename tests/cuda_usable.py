"""The skip that GPU test modules add to their ``pytestmark``: the plugin's ``requires_cuda``
marker skips them too, but they also run where the plugin is not loaded (``-p no:gputrain``,
a checkout without it installed), and there the marker is a no-op."""

from __future__ import annotations

import pytest


def cuda_usable() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())  # no context is created here


SKIP_WITHOUT_CUDA = pytest.mark.skipif(not cuda_usable(),
                                       reason="needs torch with a usable CUDA GPU")
