"""The training-run probe behind ``--gpu-diagnose``: global torch hooks around each test call.

Nothing here but ``plugin`` is imported (and nothing is installed) unless ``--gpu-diagnose`` is
on.

- ``plugin``: what pytest loads at start-up: the options (``options``) and whether the probe is
  needed; ``probe_settings`` checks the options' values where one is set; ``hooks``:
  ``ProbePlugin``, the pytest hooks that run a probe around each test and hand its records to
  the diagnosis (registered under ``--gpu-diagnose``);
- ``torch_hooks``: installs and removes the global torch hooks (optimizer steps, top-level
  forwards, backward, syncing tensor methods); every hook is tolerant and never raises into
  user code; ``callbacks``: ``ProbeCallbacks``, what the hooks call on the probe;
- ``loader``: the DataLoader iterator wrapper (time blocked per batch, loader settings);
- ``run``: ``RunProbe``, one test's probe: its lifecycle and the step boundary; its readers:
  ``module_readings`` (``ModuleWatch``: the top-level modules and their forwards),
  ``profiler_window`` (a short torch.profiler window, steered by step; ``window_analysis``: what
  its events say), ``nvml_timeline`` (NVML samples on a thread), ``compile_readings``
  (``CompileWatch``: dynamo's counters and compilations), ``cuda_readings`` (allocator counters,
  the device's memory budget, backend flags; ``CallReadings``: the test's calls the probe
  wraps) and ``settings_timeline`` (settings the test may change while it trains);
- ``run_record``: what the probe records, in small dataclasses by concern; ``StepFlag``;
- ``run_facts_builder``: the record turned into ``RunFacts`` (pure functions), with
  ``memory_facts_builder`` (the allocator), ``window_facts_builder`` (the profiler window, and
  the syncs and stalls judged against it) and ``habit_facts_builder`` (train/eval mode,
  empty_cache, optimizer, compile, DDP);
- ``failures``: classification of GPU exceptions and the allocator state at a failure;
- ``summary``: the table of probed runs (terminal summary and report section).

The facts themselves are beside the probe that measures them: ``facts`` (``RunFacts``, and the
registration of the rule scopes ``run`` and ``failure``) and ``failure_facts``
(``FailureFacts``).
"""
