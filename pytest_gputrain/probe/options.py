"""The probe's options (each with an ini twin): the table pytest shows, and nothing that checks
a value (``probe_settings.py`` does, where one is set)."""

from __future__ import annotations

from pytest_gputrain.options import Option

DEFAULT_PROFILE_STEPS = "3-6"

OPTIONS: tuple[Option, ...] = (
    Option("--gpu-probe", "gpu_probe", "diagnosis: probe each test's training run and diagnose "
           "GPU failures: on (default) or off", default="on", metavar="on|off"),
    Option("--gpu-profile-steps", "gpu_profile_steps", "diagnosis: the optimizer steps of each "
           "test that torch.profiler records, e.g. 3-6 (default) or off",
           default=DEFAULT_PROFILE_STEPS, metavar="FIRST-LAST"),
)
