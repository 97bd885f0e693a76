"""The training-run probe behind ``--gpu-diagnose``: global torch hooks around each test call.

Nothing here is imported (and nothing is installed) unless ``--gpu-diagnose`` is on.

- ``hooks``: installs and removes the global hooks (optimizer steps, top-level forwards,
  backward, syncing tensor methods); every hook is tolerant and never raises into user code.
- ``loader``: the DataLoader iterator wrapper (time blocked per batch, loader settings).
- ``profiler_window``: a short torch.profiler window and the analysis of its events.
- ``run``: ``RunProbe``, the hook callbacks that fill one test's record, and its lifecycle.
- ``run_record``: what the probe records, in small dataclasses by concern; ``StepFlag``.
- ``run_facts_builder``: the record turned into ``RunFacts`` (pure functions).
- ``cuda_readings``: allocator counters, the device's memory budget, backend flags.
- ``failures``: classification of GPU exceptions and the allocator state at a failure.
- ``session``: ``ProbePlugin``, the pytest hooks that run a probe around each test.
"""
