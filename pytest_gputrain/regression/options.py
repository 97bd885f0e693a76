"""The regression gate's options (each with an ini twin): the table pytest shows and the defaults
and limits it names; nothing that checks a value (``settings.py`` does, where one is set).
"""

from __future__ import annotations

from pytest_gputrain.options import Option

# gpu_time: the GPU's own time per step (benchmark.py). The counters (counters.py) come from the
# counting pass after the timed rounds: exact ones, then the host's CPU time and instructions.
TIME_METRICS = ("step_time", "gpu_time", "peak_vram")
EXACT_COUNTERS = ("kernels", "syncs", "h2d_copies", "h2d_bytes", "d2h_copies", "d2h_bytes",
                  "allocs", "cuda_mallocs", "ops", "bytecodes")
HOST_COUNTERS = ("host_cpu", "instructions")
COUNTER_METRICS = EXACT_COUNTERS + HOST_COUNTERS
METRICS = TIME_METRICS + COUNTER_METRICS
# The default policy (policy.py): step time and peak VRAM for every test, and by the step's
# kind its counters (launch-bound, CPU) or its GPU time (GPU-bound).
DEFAULT_REGRESSION = "auto"
DEFAULT_ALPHA = 0.01
# What a "cannot tell" (sessions that could not see a change of the threshold's size) does to the
# run: nothing (pass), a warning that passes (warn, the default: a pull request is not blocked
# by a noisy runner, but nobody reads "ok" where the gate saw nothing), or a failure (fail).
CANNOT_TELL = ("pass", "warn", "fail")
DEFAULT_CANNOT_TELL = "warn"
# The look-back window, in sessions: room for a step with 3 sessions either side, and no more
# than a store is read at once.
MIN_LOOKBACK, MAX_LOOKBACK = 6, 10_000
# The most a benchmark may ask for: past these a value is a typo (a 400-digit warm-up would
# run until the CI job times out), refused like any other bad value.
MAX_WARMUP = 10_000
MAX_ROUNDS = 100_000
MAX_TIME_S = 3_600.0
# The store when none is named, in the rootdir (``store_location.py`` applies it).
DEFAULT_DIR = ".gputrain"
DEFAULT_NAME = "benchmarks.sqlite"
DEFAULT_STORE = f"{DEFAULT_DIR}/{DEFAULT_NAME}"


OPTIONS: tuple[Option, ...] = (
    Option("--gpu-save", "gpu_save", "save this session's gpu_benchmark results in the store "
            "as a run named NAME (e.g. the branch)", metavar="NAME"),
    Option("--gpu-compare", "gpu_compare", "compare gpu_benchmark results with a saved run: "
            "NAME (its newest run), #ID, or latest; a regression fails the session",
            metavar="NAME|#ID|latest"),
    Option("--gpu-regression", "gpu_regression", "what counts as a regression: METRIC:PERCENT "
            f"pairs (METRIC:off drops one), metrics {', '.join(METRICS)}; 'auto' (the "
            "default) is step_time:5%,peak_vram:2% and, by the step's kind, its counters "
            "(kernels, syncs, copies, allocations: any rise; Python bytecodes and "
            "instructions 1%, host_cpu 2%) "
            "or gpu_time:1%; e.g. auto,step_time:2%,host_cpu:off", metavar="SPEC"),
    Option("--gpu-alpha", "gpu_alpha", "significance level of the test over sessions that a "
            f"regression needs besides the threshold (default {DEFAULT_ALPHA})",
            kind="float", metavar="ALPHA"),
    Option("--gpu-step-summary", "gpu_step_summary", "one session's step time: min (its "
            "fastest clean round, the default: what a busy host or a neighbour added is left "
            "out) or median (every round counts: a slowdown of some rounds shows)",
            metavar="min|median"),
    Option("--gpu-lookback", "gpu_lookback", "with --gpu-compare: also compare with the "
            "baseline branch's level over its newest N sessions, and report a drift no single "
            f"comparison shows (needs ruptures; N from {MIN_LOOKBACK})", kind="int", metavar="N"),
    Option("--gpu-cannot-tell", "gpu_cannot_tell", "when the sessions could not see a change "
            "of the threshold's size (verdict 'cannot tell'): pass, warn (the default: shown "
            "as a warning, the run passes) or fail (the run fails, as on a regression)",
            metavar="pass|warn|fail"),
    Option("--gpu-compare-force", "gpu_compare_force", "compare even when the baseline's "
            "environment fingerprint (GPU, driver, torch, CUDA, ...) differs",
            kind="bool", default=False),
    Option("--gpu-benchmark-json", "gpu_benchmark_json", "write benchmarks and comparisons "
            "to PATH as JSON", metavar="PATH"),
    Option("--gpu-store", "gpu_store", "benchmark store: an SQLite file (default "
            f"{DEFAULT_STORE} in the rootdir) or a postgresql:// URL shared by CI runners",
            metavar="PATH|URL"),
    Option("--gpu-benchmark-disable", "gpu_benchmark_disable", "gpu_benchmark: call each "
            "benchmarked step once, untimed (the tests run as ordinary tests; nothing is saved "
            "or compared)", kind="bool", default=False),
    Option("--gpu-benchmark-skip", "gpu_benchmark_skip", "skip the tests that use "
            "gpu_benchmark", kind="bool", default=False),
    Option("--gpu-benchmark-only", "gpu_benchmark_only", "run only the tests that use "
            "gpu_benchmark: the others are deselected (for a job that only saves or compares "
            "benchmarks)", kind="bool", default=False),
    Option("--gpu-benchmark-counters", "gpu_benchmark_counters", "gpu_benchmark: count, in "
            "an untimed pass after the timed rounds, what each step does (kernels, syncs, "
            "copies, allocations, ATen operators, Python bytecodes, the host's CPU time and "
            "instructions); on by "
            "default (--no-gpu-benchmark-counters saves the pass's few steps)",
            kind="bool", default=True),
    Option("--gpu-benchmark-warmup", "gpu_benchmark_warmup", "gpu_benchmark: untimed calls "
            f"before timing (default 5, at most {MAX_WARMUP})", kind="int", metavar="N"),
    Option("--gpu-benchmark-min-rounds", "gpu_benchmark_min_rounds", "gpu_benchmark: fewest "
            f"timed rounds (default 30, at most {MAX_ROUNDS})", kind="int", metavar="N"),
    Option("--gpu-benchmark-max-rounds", "gpu_benchmark_max_rounds", "gpu_benchmark: most "
            f"timed rounds (default 100, at most {MAX_ROUNDS})", kind="int", metavar="N"),
    Option("--gpu-benchmark-max-time", "gpu_benchmark_max_time", "gpu_benchmark: seconds of "
            "timed rounds after which no more are added beyond the minimum (default 5, at most "
            f"{MAX_TIME_S:g})", kind="float", metavar="SECONDS"),
)
