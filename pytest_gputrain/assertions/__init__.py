"""GPU assertions for pytest: markers, fixtures, test hygiene and xdist pinning.

- markers: ``requires_cuda(...)``, ``max_vram(limit, measure=...)``,
  ``min_utilization(percent, warmup=..., interval=...)``, and ``gpu`` (added to every GPU test);
- fixtures: ``gpu`` (the test's ``torch.device``) and ``gpu_monitor`` (an ``NvmlSampler``);
- options: ``--gpu-required``, ``--gpu-max-vram``, ``--gpu-vram-history``, ``--gpu-per-worker``,
  ``--gpu-share`` (each with an ini twin);
- the ``pytest_gputrain_backend`` hook and ``testing.FakeBackend`` to run all of it on a CPU.

See docs/assertions.md. Modules: ``plugin`` (hooks and fixtures), ``options`` (the option
table), ``assertion_settings`` (the options' values, checked), ``gpu_checks`` (what the hooks do
once a GPU test is found), ``marker_names``, ``markers`` (argument parsing), ``requirements``
(requires_cuda), ``memory`` (max_vram), ``utilization`` (min_utilization), ``measure``
(per-test measurements), ``failure`` (a failed limit's text), ``worker_gpus`` (xdist pinning),
``backend`` (the seam to torch and NVML), ``testing`` (the fake backend).
"""
