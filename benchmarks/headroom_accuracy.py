"""How close the ladder's batch-headroom prediction comes to the largest batch a fresh process
fits, on models and optimizers the ladder's constants were not tuned on.

    python benchmarks/headroom_accuracy.py --deadline 170 --out headroom.json  # ~4 min, H200
    python benchmarks/headroom_accuracy.py --cases resnet50-adamw,vit-sgd --out headroom.json
    python benchmarks/headroom_accuracy.py --device cpu --out smoke.json   # the plumbing, anywhere

Each case is a model, an optimizer, a precision, an image (or sequence) size and a per-process
memory budget, set with ``torch.cuda.set_per_process_memory_fraction``:

1. **Prediction.** A fresh process runs ``Ladder.largest_batch`` under the budget: its probes
   (each a new model's first two steps, the allocator's history replayed), the prediction, its
   verification (goal: no out-of-memory error in the ladder).
2. **The true largest batch.** Every candidate batch runs in a fresh process of its own under the
   same budget: a new model and optimizer, two full training steps (the second is the first with
   the optimizer's state), the question only "did it run out of memory". A k-ary search narrows
   the bracket: ``--width`` candidates a round, run at once, the first round spread around the
   prediction and holding it; the search ends when the largest batch that fits and the smallest
   that does not are neighbours. Both then run once more, each in a fresh process: a boundary
   that does not repeat itself is reported, not hidden.
3. **Ratio** = predicted / true largest (goal: 0.97 to 1.00).

Processes run in parallel on the one GPU, as many at once as their budgets and a CUDA context
each (``CONTEXT_GIB``) fit in its free memory, and no more than ``--parallel``. Torchvision is
imported inside the cases that use it (ResNet-50, ViT-B/16, ConvNeXt-T); the GPT-style model is
plain torch. Results go to ``--out`` (JSON) after every process, and to a Markdown table beside
it (same name, ``.md``) after every case, so a run cut short keeps what finished; ``--deadline``
stops starting processes after that many seconds.

``--device cpu`` is a smoke run of the orchestration (processes, search, outputs) with tiny
models: there is no allocator limit on the CPU, so "fits" and the prediction come from a
stated memory model (``SMOKE_LIMIT``), not a measurement.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
RESULT_MARK = "HEADROOM-RESULT "
CONTEXT_GIB = 1.5  # a process's CUDA context, cuDNN and cuBLAS handles: outside its budget
JOB_TIMEOUT_S = 180.0  # one process: imports, model, two steps (or the ladder's rung)
GRACE_S = 40.0  # after --deadline, for the processes already running
SMOKE_LIMIT = 300  # --device cpu: the largest batch that "fits", and the prediction below it


# -- cases ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    model: str  # resnet50, vit_b_16, convnext_tiny, gpt, product; tiny-gpt on the CPU
    optimizer: str  # sgd (momentum 0.9) or adamw
    budget_gib: float
    size: int  # image side, or sequence length for the GPT-style models
    precision: str = "bf16"
    start_batch: int = 32
    tuned_on: bool = False  # the ladder's constants were set on this model

    def describe(self) -> str:
        what = {"resnet50": "ResNet-50", "vit_b_16": "ViT-B/16", "convnext_tiny": "ConvNeXt-T",
                "gpt": "GPT-style LM (8 x 512, vocab 16k)", "product": "sample project",
                "tiny-gpt": "tiny GPT-style LM"}[self.model]
        unit = "tokens" if "gpt" in self.model else "px"
        return f"{what}, {self.size} {unit}"


CASES = {case.name: case for case in (
    # The case first: it has the largest budget and decides when the run ends.
    Case("resnet50-adamw", "resnet50", "adamw", 12, 160, tuned_on=True),
    Case("resnet50-sgd", "resnet50", "sgd", 12, 160, tuned_on=True),
    Case("vit-adamw", "vit_b_16", "adamw", 8, 128),
    Case("vit-sgd", "vit_b_16", "sgd", 8, 128),
    Case("convnext-adamw", "convnext_tiny", "adamw", 8, 128),
    Case("convnext-sgd", "convnext_tiny", "sgd", 8, 128),
    Case("gpt-adamw", "gpt", "adamw", 8, 128),
    Case("gpt-sgd", "gpt", "sgd", 8, 128),
    Case("product", "product", "adamw", 14, 64, tuned_on=True),  # not in the default run
)}
DEFAULT_CASES = [name for name in CASES if name != "product"]
SMOKE_CASES = {case.name: case for case in (
    Case("smoke-adamw", "tiny-gpt", "adamw", 1, 16, precision="fp32", start_batch=8),
    Case("smoke-sgd", "tiny-gpt", "sgd", 1, 16, precision="fp32", start_batch=8),
)}


def make_optimizer(name: str, model: Any) -> Any:
    import torch

    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def autocast_dtype(precision: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def classify_step(model: Any, batch: Any, optimizer: Any, device: Any, precision: str) -> Any:
    import torch

    inputs, labels = (t.to(device, non_blocking=True) for t in batch)
    dtype = autocast_dtype(precision)
    with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, -2).float(),
                                                 labels.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def repeated(make: Callable[[], tuple[Any, Any]]) -> Any:
    """One batch made once and repeated: the steps measure memory, not data loading."""
    import torch

    inputs, labels = make()
    if torch.cuda.is_available():
        inputs, labels = inputs.pin_memory(), labels.pin_memory()
    return itertools.repeat((inputs, labels))


def gpt_model(vocab: int, width: int, layers: int, heads: int, length: int) -> Any:
    """A decoder-only language model in plain torch (pre-norm blocks, causal attention)."""
    import torch
    from torch import nn

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.position = nn.Parameter(torch.randn(length, width) * 0.02)
            block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                               activation="gelu", batch_first=True,
                                               norm_first=True)
            self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)
            self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(length),
                                 persistent=False)

        def forward(self, tokens: Any) -> Any:
            hidden = self.embed(tokens) + self.position[: tokens.shape[1]]
            hidden = self.blocks(hidden, mask=self.causal, is_causal=True)
            return self.head(self.norm(hidden))

    return GPT()


def ladder_spec(case: Case) -> Any:
    """The case as a ``LadderSpec``: what the ladder and the fresh processes both run."""
    import torch

    from pytest_gputrain.ladder import LadderSpec

    if case.model == "product":
        sys.path.insert(0, str(ROOT / "sample_projects" / "product_classifier"))
        from product_classifier.ladder import ladder_spec as product_spec

        return product_spec()
    side = case.size
    if case.model in ("gpt", "tiny-gpt"):
        vocab, width, layers, heads = ((16_384, 512, 8, 8) if case.model == "gpt"
                                       else (100, 32, 2, 2))

        def make_model() -> Any:
            return gpt_model(vocab, width, layers, heads, side)

        def batches(size: int) -> Any:
            tokens = torch.randint(vocab, (size, side + 1))
            return repeated(lambda: (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    else:
        import torchvision  # on the GPU machine, not in the project's test dependencies

        builders = {"resnet50": lambda: torchvision.models.resnet50(weights=None),
                    "vit_b_16": lambda: torchvision.models.vit_b_16(weights=None,
                                                                    image_size=side),
                    "convnext_tiny": lambda: torchvision.models.convnext_tiny(weights=None)}
        make_model = builders[case.model]

        def batches(size: int) -> Any:
            return repeated(lambda: (torch.randn(size, 3, side, side),
                                     torch.randint(1000, (size,))))

    return LadderSpec(name=case.name, make_model=make_model,
                      make_optimizer=lambda model: make_optimizer(case.optimizer, model),
                      batches=batches, step=classify_step)


# -- the processes ------------------------------------------------------------------------------


def child_main(role: str, case: Case, batch: int, budget: int, device: str) -> dict[str, Any]:
    """One fresh process: ``predict`` (the ladder's rung) or ``fits`` (two steps at ``batch``)."""
    started = time.perf_counter()
    if device == "cpu" and role == "fits":  # the smoke run: memory modelled, no torch needed
        return {"batch": batch, "fits": batch <= SMOKE_LIMIT, "modelled": True,
                "seconds": time.perf_counter() - started}
    import torch

    spec = ladder_spec(case)
    torch.manual_seed(0)
    if device == "cpu":  # the smoke run's prediction: two real steps of the tiny model
        model = spec.make_model()
        optimizer = spec.make_optimizer(model)
        steps = spec.batches(case.start_batch)
        losses = [float(spec.step(model, next(steps), optimizer, torch.device("cpu"),
                                  case.precision)) for _ in range(2)]
        return {"predicted": int(SMOKE_LIMIT * 0.98), "verified": True, "probes": [],
                "note": "", "ladder_ooms": 0, "allocator_ooms": 0, "modelled": True,
                "losses": losses, "torch": torch.__version__,
                "seconds": time.perf_counter() - started}

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(budget / total)
    cuda = torch.device("cuda")
    if role == "predict":
        from pytest_gputrain.ladder import Ladder

        record = Ladder(spec).largest_batch(case.precision, start_batch=case.start_batch,
                                            budget=budget)
        return {**asdict(record),
                # The ladder's own: a verification that ran out of memory (its note names each).
                "ladder_ooms": record.note.count("ran out of memory"),
                # The allocator's count also holds the allocations cuDNN tries and catches
                # (a large workspace, then a smaller plan): not failures of the rung.
                "allocator_ooms": int(torch.cuda.memory_stats().get("num_ooms", 0)),
                "device_name": torch.cuda.get_device_name(0), "torch": torch.__version__,
                "seconds": time.perf_counter() - started}
    model = spec.make_model().to(cuda)
    optimizer = spec.make_optimizer(model)
    steps = spec.batches(batch)
    free_at_oom, error, at_oom = None, None, {}
    try:
        for _ in range(2):
            spec.step(model, next(steps), optimizer, cuda, case.precision)
        torch.cuda.synchronize()
        fits = True
    except (torch.OutOfMemoryError, RuntimeError) as failure:
        # A library that allocates on its own says so in a RuntimeError (cuBLAS's
        # CUBLAS_STATUS_ALLOC_FAILED): out of memory too. Any other error is the case's bug.
        text = str(failure)
        if not isinstance(failure, torch.OutOfMemoryError) and not (
                "out of memory" in text.lower() or "ALLOC_FAILED" in text):
            raise
        fits, error = False, text.splitlines()[0][:600] if text else type(failure).__name__
        free_at_oom = int(torch.cuda.mem_get_info()[0])
        # What the allocator held when it gave up (it had given back every free segment): the
        # live bytes, and the free pieces of the segments they pin.
        stats = torch.cuda.memory_stats()
        at_oom = {"allocated_at_oom": stats.get("allocated_bytes.all.current"),
                  "reserved_at_oom": stats.get("reserved_bytes.all.current")}
    stats = torch.cuda.memory_stats()
    return {"batch": batch, "fits": fits, "error": error,
            "peak_allocated": int(torch.cuda.max_memory_allocated()),
            "peak_reserved": int(torch.cuda.max_memory_reserved()),
            # Allocations the allocator failed (cuDNN catches its own and picks a plan with a
            # smaller workspace) and the times it gave back its cache to retry one.
            "allocator_ooms": int(stats.get("num_ooms", 0)),
            "alloc_retries": int(stats.get("num_alloc_retries", 0)), **at_oom,
            # A failure with little free on the device was other processes', not the budget's.
            "free_at_oom": free_at_oom, "seconds": time.perf_counter() - started}


class GpuMemory:
    """The GPU's free memory shared by the processes: a process starts when its budget and a
    context fit and no more than ``limit`` run, in the order asked (FIFO, so a large budget is
    not starved by small ones); none starts after ``deadline`` (time.monotonic())."""

    def __init__(self, capacity: float, limit: int, deadline: float) -> None:
        self.capacity, self.limit, self.deadline = capacity, limit, deadline
        self._used, self._running = 0.0, 0
        self._queue: deque[object] = deque()
        self._changed = threading.Condition()

    def acquire(self, nbytes: float) -> bool:
        ticket = object()
        with self._changed:
            self._queue.append(ticket)
            try:
                while not (self._queue[0] is ticket and self._running < self.limit
                           and self._used + nbytes <= self.capacity):
                    if time.monotonic() >= self.deadline:
                        return False
                    self._changed.wait(timeout=0.5)
                if time.monotonic() >= self.deadline:
                    return False
                self._used += nbytes
                self._running += 1
                return True
            finally:
                self._queue.remove(ticket)
                self._changed.notify_all()

    def release(self, nbytes: float) -> None:
        with self._changed:
            self._used -= nbytes
            self._running -= 1
            self._changed.notify_all()


class Stopped(RuntimeError):
    """The deadline passed before a process could start."""


def run_child(role: str, case: Case, batch: int, budget: int, device: str, memory: GpuMemory,
              hard_deadline: float) -> dict[str, Any]:
    nbytes = 0.0 if device == "cpu" else budget + CONTEXT_GIB * GiB
    if not memory.acquire(nbytes):
        raise Stopped(f"{case.name}: the deadline passed before {role} {batch} could start")
    try:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env.setdefault("OMP_NUM_THREADS", "2")  # many processes share the host's cores
        command = [sys.executable, str(Path(__file__).resolve()), "--child", role,
                   "--cases", case.name, "--batch", str(batch), "--budget-bytes", str(budget),
                   "--device", device]
        timeout = max(1.0, min(JOB_TIMEOUT_S, hard_deadline - time.monotonic()))
        try:
            completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                       env=env, check=False)
        except subprocess.TimeoutExpired as expired:
            if time.monotonic() >= hard_deadline - 1:
                raise Stopped(f"{case.name}: {role} {batch} still ran at the deadline"
                              ) from expired
            raise RuntimeError(f"{case.name}: {role} {batch} did not finish in {timeout:.0f} s"
                               ) from expired
        results = [line[len(RESULT_MARK):] for line in completed.stdout.splitlines()
                   if line.startswith(RESULT_MARK)]
        if completed.returncode != 0 or not results:
            raise RuntimeError(f"{case.name}: {role} {batch} exited {completed.returncode}: "
                               f"{(completed.stderr or completed.stdout)[-1500:]}")
        return dict(json.loads(results[-1]))
    finally:
        memory.release(nbytes)


# -- the search ---------------------------------------------------------------------------------

FIRST_ROUND = (0.94, 1.10)  # the first round's spread around the prediction
GROWTH = 0.08  # per candidate, while every batch tried fits (or none does)


def candidates(low: int | None, high: int | None, guess: int, width: int) -> list[int]:
    """The next round's batch sizes. ``low`` fits, ``high`` does not (None: not known yet).
    Both known: up to ``width`` evenly spaced strictly between them (none when neighbours).
    Neither: spread over FIRST_ROUND around ``guess``, the guess among them (the ladder's
    prediction, run in a fresh process). One side: stepping away from it."""
    if low is not None and high is not None:
        count = min(width, high - low - 1)
        return sorted({low + round((high - low) * (i + 1) / (count + 1)) for i in range(count)}
                      - {low, high})
    if low is None and high is None:  # the guess itself, in place of the nearest spread one
        lo, hi = FIRST_ROUND
        spread = {max(1, round(guess * (lo + (hi - lo) * i / max(width - 1, 1))))
                  for i in range(width)}
        spread.discard(min(spread, key=lambda b: (abs(b - guess), b)))
        return sorted(spread | {max(1, guess)})
    if low is not None:  # everything tried fitted: step up
        return sorted({max(low + 1 + i, round(low * (1 + GROWTH * (i + 1))))
                       for i in range(width)})
    assert high is not None  # nothing tried fitted: step down
    steps = (min(high - 1 - i, round(high * (1 - GROWTH * (i + 1)))) for i in range(width))
    return sorted({b for b in steps if b >= 1})


def narrow(low: int | None, high: int | None, tried: dict[int, bool]
           ) -> tuple[int | None, int | None, list[int]]:
    """The bracket after a round: the smallest batch that did not fit is the new ``high``, the
    largest that fitted below it the new ``low``. Batches that fitted at or above ``high`` are
    returned: the boundary is not sharp there (fragmentation can make a larger batch fit)."""
    failed = [b for b, fits in tried.items() if not fits]
    if failed:
        high = min(failed + ([high] if high is not None else []))
    fitted = [b for b, fits in tried.items() if fits and (high is None or b < high)]
    if fitted:
        low = max(fitted + ([low] if low is not None else []))
    above = sorted(b for b, fits in tried.items() if fits and high is not None and b >= high)
    return low, high, above


@dataclass
class Search:
    low: int | None = None
    high: int | None = None
    rounds: int = 0
    tried: dict[int, bool] = field(default_factory=dict)
    above_boundary: list[int] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.low is not None and self.high is not None and self.high - self.low == 1


def search_largest(try_batches: Callable[[list[int]], dict[int, bool]], guess: int, width: int,
                   max_rounds: int = 12, on_round: Callable[[Search], None] | None = None
                   ) -> Search:
    """The largest batch that fits, by rounds of ``width`` batches tried at once."""
    state = Search()
    while state.rounds < max_rounds and not state.exact:
        batches = [b for b in candidates(state.low, state.high, guess, width)
                   if b not in state.tried]
        if not batches:
            break
        tried = try_batches(batches)
        state.tried.update(tried)
        state.rounds += 1
        state.low, state.high, above = narrow(state.low, state.high, tried)
        state.above_boundary = sorted(set(state.above_boundary) | set(above))
        if state.low is None and state.high == 1:
            break  # not even one sample fits
        if on_round is not None:
            on_round(state)
    return state


def confirm_boundary(try_batches: Callable[[list[int]], dict[int, bool]], state: Search,
                     repeats: int = 1) -> dict[str, Any]:
    """Each side of the boundary run again in fresh processes, ``repeats`` times: the largest
    batch that fitted must fit again, the smallest that did not must fail again. A fresh
    process at one batch is expected to repeat itself (same model, seed and sizes, so the same
    allocations); one that does not is reported, and the boundary with it."""
    if not state.exact or state.low is None or state.high is None:
        return {"confirmed": None, "repeats": {}, "why": "no exact boundary to run again"}
    outcomes: dict[int, list[bool]] = {state.low: [], state.high: []}
    for _ in range(repeats):
        for batch, fits in try_batches([state.low, state.high]).items():
            outcomes[batch].append(fits)
    confirmed = all(outcomes[state.low]) and not any(outcomes[state.high])
    why = "" if confirmed else (
        f"batch {state.low} fitted, then {outcomes[state.low].count(False)} of "
        f"{len(outcomes[state.low])} repeats ran out of memory; batch {state.high} ran out of "
        f"memory, then fitted {outcomes[state.high].count(True)} of "
        f"{len(outcomes[state.high])} repeats")
    return {"confirmed": confirmed, "repeats": {str(b): v for b, v in outcomes.items()},
            "why": why}


# -- results ------------------------------------------------------------------------------------


class Results:
    """Everything measured so far, written to ``path`` (JSON) after each process and to its
    ``.md`` sibling after each case; one lock for the case threads."""

    def __init__(self, path: Path | None, header: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {**header, "cases": {}}
        self._lock = threading.Lock()

    def update(self, case: str, **values: Any) -> None:
        with self._lock:
            self.data["cases"].setdefault(case, {}).update(values)
            self._write_json()

    def add_trial(self, case: str, trial: dict[str, Any]) -> None:
        with self._lock:
            self.data["cases"].setdefault(case, {}).setdefault("trials", []).append(trial)
            self._write_json()

    def _write_json(self) -> None:
        if self.path is None:
            return
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
        partial.replace(self.path)

    def finish(self, seconds: float) -> None:
        with self._lock:
            self.data["seconds"] = round(seconds, 1)
            self._write_json()

    def processes(self) -> int:
        return sum(len(entry.get("trials", [])) + ("prediction" in entry)
                   for entry in self.data["cases"].values())

    def write_markdown(self) -> str:
        with self._lock:
            text = markdown(self.data)
            if self.path is not None:
                self.path.with_suffix(".md").write_text(text)
            return text


def _gib(nbytes: float | None) -> str:
    return "–" if nbytes is None else f"{nbytes / GiB:.2f}"


def _waste(prediction: dict[str, Any]) -> int | None:
    """What the replayed allocator needed beyond the verification's peak: its fragmentation."""
    room, peak = prediction.get("verified_room"), prediction.get("verified_peak")
    return None if room is None or peak is None else room - peak


def _outcome(fits: bool | None) -> str:
    return "–" if fits is None else "fits" if fits else "out of memory"


def _boundary(boundary: dict[str, Any] | None) -> str:
    if not boundary or boundary.get("confirmed") is None:
        return "–"
    return "same" if boundary["confirmed"] else "differed"


def verdict(entry: dict[str, Any]) -> str:
    ratio, ooms = entry.get("ratio"), entry.get("ladder_ooms")
    if entry.get("status") == "done" and ratio is None:
        return "MISSED (nothing predicted, or nothing fits)"
    if ratio is None or ooms is None:
        return str(entry.get("status", "not run"))
    met = "ok" if 0.97 <= ratio <= 1.0 and ooms == 0 else "MISSED"
    confirmed = entry.get("boundary", {}).get("confirmed", True)
    if confirmed is None:
        return f"{met}, boundary not run again"
    return met if confirmed else f"{met}, boundary not repeatable"


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"Headroom accuracy, {data['date']} on {data.get('device', '?')} "
        f"(torch {data.get('torch', '?')}, commit {data.get('commit') or 'unknown'}); "
        f"goal: predicted / true largest in 0.97-1.00 with no out-of-memory error in the ladder."
        + (" SMOKE RUN: memory modelled, not measured." if data.get("smoke") else ""),
        "",
        "| case | model | optimizer | precision | budget GiB | probes (batch: GiB outside "
        "the optimizer step) | update GiB | predicted | true largest | ratio | ladder OOMs | "
        "allocator OOMs | left by probes GiB | verified peak GiB | peak at true largest GiB | "
        "waste counted by | waste replayed at the prediction GiB | prediction in a fresh process | "
        "boundary run again | processes | verdict |",
        "|" + "---|" * 21,
    ]
    for name, entry in data["cases"].items():
        config = entry.get("config", {})
        prediction = entry.get("prediction", {})
        probes = ", ".join(f"{b}: {_gib(p)}" for b, p in prediction.get("probes", [])) or "–"
        updates = [p for p in prediction.get("optimizer_peaks") or [] if p is not None]
        true, bracket = entry.get("true_largest"), entry.get("bracket") or [None, None]
        true_text = (f"{true}" if true is not None and entry.get("exact")
                     else f"bracket {bracket}" if any(b is not None for b in bracket) else "–")
        at_true = next((t.get("peak_allocated") for t in entry.get("trials", [])
                        if t.get("batch") == true), None)
        ratio = entry.get("ratio")
        lines.append(
            f"| {name} | {config.get('model', '?')} | {config.get('optimizer', '?')} | "
            f"{config.get('precision', '?')} | {config.get('budget_gib', '?')} | {probes} | "
            f"{_gib(max(updates)) if updates else '–'} | {prediction.get('predicted', '–')} | "
            f"{true_text} | {'–' if ratio is None else f'{ratio:.3f}'} | "
            f"{entry.get('ladder_ooms', '–')} | {prediction.get('allocator_ooms', '–')} | "
            f"{_gib(prediction.get('left_by_probes'))} | "
            f"{_gib(prediction.get('verified_peak'))} | {_gib(at_true)} | "
            f"{prediction.get('waste_by') or '–'} | {_gib(_waste(prediction))} | "
            f"{_outcome(entry.get('fresh_at_prediction'))} | "
            f"{_boundary(entry.get('boundary'))} | "
            f"{len(entry.get('trials', [])) + bool(prediction)} | {verdict(entry)} |")
    if "seconds" in data:
        lines += ["", f"{data['seconds']:.0f} s in all, at most {data.get('parallel')} "
                      f"processes at once, {data.get('width')} batches a search round."]
    notes = [f"- {name}: {note}" for name, entry in data["cases"].items()
             for note in entry.get("notes", [])]
    return "\n".join(lines + (["", *notes] if notes else [])) + "\n"


# -- one case -----------------------------------------------------------------------------------


def run_case(case: Case, budget: int, width: int, device: str, memory: GpuMemory,
             hard_deadline: float, results: Results) -> None:
    config = {**asdict(case), "budget_gib": round(budget / GiB, 3), "model": case.describe()}
    results.update(case.name, config=config, status="predicting", notes=[])
    notes: list[str] = []
    try:
        prediction = run_child("predict", case, 0, budget, device, memory, hard_deadline)
        ladder_ooms = int(prediction.get("ladder_ooms", 0))
        results.update(case.name, prediction=prediction, ladder_ooms=ladder_ooms,
                       status="searching")
        results.data.setdefault("torch", prediction.get("torch"))
        if prediction.get("note"):
            notes.append(f"ladder: {prediction['note']}")
        predicted = prediction.get("predicted")

        def try_batches(batches: list[int]) -> dict[int, bool]:
            with concurrent.futures.ThreadPoolExecutor(len(batches)) as pool:
                futures = {b: pool.submit(run_child, "fits", case, b, budget, device, memory,
                                          hard_deadline) for b in batches}
                tried = {}
                for batch, future in futures.items():
                    trial = future.result()
                    results.add_trial(case.name, trial)
                    tried[batch] = bool(trial["fits"])
                    if not trial["fits"] and (trial.get("free_at_oom") or GiB) < GiB:
                        notes.append(f"batch {batch} ran out of memory with "
                                     f"{_gib(trial['free_at_oom'])} GiB free on the device: "
                                     f"other processes', not the budget's")
            return tried

        def on_round(state: Search) -> None:
            results.update(case.name, bracket=[state.low, state.high], rounds=state.rounds)

        state = search_largest(try_batches, int(predicted or case.start_batch * 4), width,
                               on_round=on_round)
        if state.above_boundary:
            notes.append(f"batches {state.above_boundary} fitted at or above the smallest "
                         f"that did not ({state.high}): the boundary is not sharp")
        ratio = (predicted / state.low) if predicted and state.low else None
        results.update(case.name, true_largest=state.low, bracket=[state.low, state.high],
                       exact=state.exact, rounds=state.rounds, ratio=ratio,
                       fresh_at_prediction=state.tried.get(int(predicted or 0)),
                       status="confirming", notes=notes)
        try:
            boundary = confirm_boundary(try_batches, state)
        except Stopped:
            boundary = {"confirmed": None, "repeats": {},
                        "why": "the deadline passed before the boundary could run again"}
        if boundary["why"]:
            notes.append(f"boundary: {boundary['why']}")
        results.update(case.name, boundary=boundary, status="done", notes=notes)
    except (Stopped, RuntimeError) as error:
        notes.append(str(error))
        results.update(case.name, status="cut short" if isinstance(error, Stopped) else "failed",
                       notes=notes)
    results.write_markdown()
    print(summary_line(case.name, results.data["cases"][case.name]), flush=True)


def summary_line(name: str, entry: dict[str, Any]) -> str:
    ratio = entry.get("ratio")
    return (f"{name}: predicted {entry.get('prediction', {}).get('predicted', '–')}, true "
            f"largest {entry.get('true_largest', '–')}, ratio "
            f"{'–' if ratio is None else f'{ratio:.3f}'}, ladder OOMs "
            f"{entry.get('ladder_ooms', '–')}: {verdict(entry)}")


# -- the command --------------------------------------------------------------------------------


def commit() -> str | None:
    try:
        completed = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                   capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return None
    return completed.stdout.strip() or None


def gpu_capacity() -> tuple[float, str, str]:
    """Free bytes on GPU 0 (this process's own context counted as used), its name, torch's
    version."""
    import torch

    free, _ = torch.cuda.mem_get_info(0)
    return float(free), torch.cuda.get_device_name(0), torch.__version__


def parse_cases(text: str, known: dict[str, Case]) -> list[Case]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(f"--cases: {', '.join(unknown) or 'none given'}; choose from "
                         f"{', '.join(known)}")
    return [known[name] for name in names]


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default) or cpu (a smoke run of the orchestration, "
                             "memory modelled)")
    parser.add_argument("--cases", help="comma-separated case names (default: every case but "
                                        f"product: {', '.join(DEFAULT_CASES)})")
    parser.add_argument("--budget-gib", type=float,
                        help="one budget for every case instead of each case's own")
    parser.add_argument("--width", type=int, default=8,
                        help="batches tried at once in each search round (default 8)")
    parser.add_argument("--parallel", type=int,
                        help="most processes at once (default: what the GPU's free memory "
                             "holds, at most the CPU count; 2 on the CPU)")
    parser.add_argument("--deadline", type=float, default=270.0,
                        help="seconds after which no process starts (default 270); running "
                             f"ones get {GRACE_S:.0f} s more")
    parser.add_argument("--out", type=Path, help="JSON results, rewritten after every "
                                                 "process; the Markdown table beside it (.md)")
    parser.add_argument("--commit", help="the commit measured, for the table (default: git's "
                                         "HEAD, where the checkout has .git)")
    parser.add_argument("--child", choices=("predict", "fits"), help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--budget-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(list(argv) if argv is not None else None)
    known = SMOKE_CASES if args.device == "cpu" else CASES
    try:
        cases = parse_cases(args.cases or ",".join(known if args.device == "cpu"
                                                   else DEFAULT_CASES), known)
    except ValueError as error:
        parser.error(str(error))
    if args.child:
        print(RESULT_MARK + json.dumps(child_main(args.child, cases[0], args.batch,
                                                  args.budget_bytes, args.device)), flush=True)
        return 0
    for name in ("width", "parallel"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be at least 1, got {value}")

    started = time.monotonic()
    header: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": args.commit or commit(), "smoke": args.device == "cpu", "width": args.width,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    if args.device == "cpu":
        capacity, limit = float("inf"), args.parallel or 2
        header["device"] = "the CPU"
    else:
        sys.path.insert(0, str(ROOT))
        free, header["device"], header["torch"] = gpu_capacity()
        capacity = free * 0.95
        limit = args.parallel or max(1, min(os.cpu_count() or 1, 12))
        largest = max((args.budget_gib or case.budget_gib) * GiB for case in cases)
        if largest + CONTEXT_GIB * GiB > capacity:
            parser.error(f"a {largest / GiB:.1f} GiB budget does not fit the "
                         f"{free / GiB:.1f} GiB free on the GPU")
    header["parallel"] = limit
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    results = Results(args.out, header)
    memory = GpuMemory(capacity, limit, started + args.deadline)
    hard_deadline = started + args.deadline + GRACE_S
    threads = [threading.Thread(target=run_case, name=case.name, args=(
        case, int((args.budget_gib or case.budget_gib) * GiB), args.width, args.device, memory,
        hard_deadline, results)) for case in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.finish(time.monotonic() - started)
    print(results.write_markdown(), flush=True)
    print(f"took {time.monotonic() - started:.0f} s; {results.processes()} processes"
          + (f"; results in {args.out} and {args.out.with_suffix('.md')}" if args.out else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
