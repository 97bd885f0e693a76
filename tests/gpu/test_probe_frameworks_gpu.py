"""The frameworks' habits as the probe sees them on a CUDA GPU (written for the lent H200).

The framework samples' training code (sample_projects/pipelines/hf_trainer_healthy,
lightning_healthy), shrunk, runs on the GPU under a probe in this process: the Hugging Face
Trainer's NaN/Inf loss filter syncs are counted as the Trainer's own (by their call site in
``transformers``) with the host's wait in them, and Lightning's bf16-mixed precision shows as
autocast forwards. Skipped without CUDA or without the frameworks
(``pip install 'pytest-gputrain[frameworks]'``; on the device ``FRAMEWORKS=1
../shared/device/stage``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cuda_usable import SKIP_WITHOUT_CUDA
from probed_run import probed
from sample_modules import load_sample

pytestmark = [SKIP_WITHOUT_CUDA, pytest.mark.requires_cuda, pytest.mark.gpu,
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


def _probed(train: Callable[[], Any]) -> Any:
    return probed(train)[1]


def test_the_trainers_nan_filter_syncs_are_the_trainers_own(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="pip install 'pytest-gputrain[frameworks]'")
    pytest.importorskip("accelerate", reason="pip install 'pytest-gputrain[frameworks]'")
    sample = load_sample("hf_trainer_healthy")
    facts = _probed(lambda: sample.train(str(tmp_path), 24, layers=2, width=256, length=128,
                                         batch_size=8, workers=0))
    assert facts.framework == "transformers" and facts.device == "cuda:0"
    assert facts.sync.framework == "transformers"
    # `torch.isnan(loss) or torch.isinf(loss)` in every step: two __bool__ calls
    assert any(call.startswith("transformers: __bool__:") for call in facts.sync.framework_calls)
    assert facts.sync.framework_per_step is not None and facts.sync.framework_per_step >= 2
    assert facts.sync.wait_percent is not None
    assert facts.batch_tokens == 8 * 128


def test_lightning_bf16_mixed_trains_under_autocast() -> None:
    pytest.importorskip("pytorch_lightning", reason="pip install 'pytest-gputrain[frameworks]'")
    sample = load_sample("lightning_healthy")
    data = sample.Data(images=256, size=64, batch_size=32, workers=0)
    facts = _probed(lambda: sample.train("gpu", 16, data))
    assert facts.framework == "lightning" and facts.device == "cuda:0"
    assert facts.steps == 16 and facts.backwards == 16
    assert facts.autocast_forwards >= 16
    # no progress bar and no logger: Lightning reads none of the logged values back per step
    assert facts.sync.per_step is not None and facts.sync.per_step <= 1
