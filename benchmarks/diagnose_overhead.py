"""What ``--gpu-diagnose`` costs a training loop, measured the way users run one.

Two loops, written as users write them: no synchronisation per step, ``loss.item()`` every
``--item-every`` steps for the log, one synchronisation at the end of a round:

- ``resnet18``: ResNet-18 (torchvision's layout, built here), batch 32, 224x224, fp32, SGD
  with momentum, pinned batches from a DataLoader copied with ``non_blocking`` (~7.7 ms a step
  on an H200);
- ``mlp``: an MLP under bf16 autocast with AdamW, data made on the device (~1.2 ms a step).

Three modes, each in its own pytest process running one training test, the plugin installed
as users get it: ``plain`` (``-p no:gputrain``: the plugin not loaded), ``loaded`` (the plugin
loaded, no diagnosis) and ``diagnose`` (``--gpu-diagnose``: the probe with its profiler window at
steps 3-6, inside the warm-up). ``--procs`` processes per mode and loop stay alive together; the
controller tells one process at a time to run a round, in an order shuffled each round, so that
the modes' rounds interleave and drift in clocks and temperature hits them alike. Per mode, the
median of the rounds' per-step times is compared with plain's: loaded / plain (goal 1.00) and
diagnose / plain (goal <= 1.03; every round runs after the profiler window, so what the window
leaves behind counts). Each ratio comes with its 90 % bootstrap interval over processes (the
processes of each mode drawn again with replacement, a fixed seed): a process, not a round, is
what varies, so the interval says how far the ratio could move with other processes. The
warm-ups run one process at a time too; the diagnosing processes' extra warm-up time is the
diagnosis's cost per test (hooks, the window, CUPTI's start).

Every process is pinned to the same ``--cpus`` CPUs (default 8 on CUDA; ``os.sched_setaffinity``
before it starts): only one runs a round at a time, and a host-bound loop's speed depends on
the cores it lands on, which would otherwise differ from process to process and from mode to
mode.

    python benchmarks/diagnose_overhead.py                    # CUDA: about 2 minutes on an H200
    python benchmarks/diagnose_overhead.py --device cpu       # tiny sizes, runs anywhere
    python benchmarks/diagnose_overhead.py --json out.json --check
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import queue
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from cpu_pinning import cpu_sets
from cpu_pinning import describe as describe_cpus

ROOT = Path(__file__).resolve().parents[1]
MODES = ("plain", "loaded", "diagnose")
LOOPS = ("resnet18", "mlp")
GOALS = {"loaded": 1.00, "diagnose": 1.03}
NOISE = 0.01  # --check allows plain-vs-plain noise above the loaded goal
STARTUP_TIMEOUT = 300.0  # seconds for every process to import torch and build its loop
REPLY_TIMEOUT = 300.0  # seconds for one warm-up or round
BOOTSTRAP_DRAWS = 2000  # resamples of the processes behind each ratio's interval

# Sizes per device: the CUDA ones are the loops; the CPU ones keep a smoke run short.
SIZES: dict[str, dict[str, dict[str, int]]] = {
    "cuda": {
        "resnet18": {"batch": 32, "image": 224, "width": 64, "classes": 1000, "batches": 16,
                     "steps": 250, "warmup": 30},
        "mlp": {"batch": 1024, "features": 1024, "width": 2048, "depth": 8, "classes": 1000,
                "batches": 16, "steps": 250, "warmup": 30},
    },
    "cpu": {
        "resnet18": {"batch": 4, "image": 32, "width": 8, "classes": 10, "batches": 8,
                     "steps": 15, "warmup": 8},
        "mlp": {"batch": 64, "features": 64, "width": 128, "depth": 4, "classes": 10,
                "batches": 8, "steps": 60, "warmup": 8},
    },
}

# The training test each process runs. It builds its loop, connects to the controller and
# then does what it is told: a warm-up, rounds of steps, stop. Plain PyTorch, as users write it.
TEST_SOURCE = '''
import json
import os
import sys
import time
from multiprocessing.connection import Client

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

CONFIG = json.loads(os.environ["GPUTRAIN_OVERHEAD"])


class BasicBlock(nn.Module):
    def __init__(self, inp, out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.down = None
        if stride != 1 or inp != out:
            self.down = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False),
                                      nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + identity)


class ResNet18(nn.Module):
    def __init__(self, classes, width):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        layers, channels = [], width
        for index, out in enumerate((width, width * 2, width * 4, width * 8)):
            layers += [BasicBlock(channels, out, 1 if index == 0 else 2),
                       BasicBlock(out, out, 1)]
            channels = out
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Batches(Dataset):
    """Ready-made batches in (pinned) host memory, as a loader's collate would leave them."""

    def __init__(self, count, batch, image, classes, pin):
        generator = torch.Generator().manual_seed(0)
        self.items = []
        for _ in range(count):
            x = torch.randn(batch, 3, image, image, generator=generator)
            y = torch.randint(0, classes, (batch,), generator=generator)
            self.items.append((x.pin_memory(), y.pin_memory()) if pin else (x, y))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def resnet_loop(device, size):
    model = ResNet18(size["classes"], size["width"]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(Batches(size["batches"], size["batch"], size["image"], size["classes"],
                                pin=device.type == "cuda"), batch_size=None, shuffle=True)

    def batches():
        while True:
            for x, y in loader:
                yield x, y

    stream = batches()

    def step():
        x, y = next(stream)
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    return step


def mlp_loop(device, size):
    layers = [nn.Linear(size["features"], size["width"]), nn.GELU()]
    for _ in range(size["depth"] - 1):
        layers += [nn.Linear(size["width"], size["width"]), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(size["width"], size["classes"])).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device=device).manual_seed(0)
    count, batch = size["batches"], size["batch"]
    inputs = torch.randn(count * batch, size["features"], device=device, generator=generator)
    labels = torch.randint(0, size["classes"], (count * batch,), device=device,
                           generator=generator)
    position = [0]

    def step():
        start = position[0] * batch
        position[0] = (position[0] + 1) % count
        x, y = inputs[start:start + batch], labels[start:start + batch]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    return step


def run(step, sync, steps, item_every):
    sync()
    started = time.perf_counter()
    for index in range(1, steps + 1):
        loss = step()
        if index % item_every == 0:
            loss.item()  # the log line's sync
    sync()
    return time.perf_counter() - started


def test_training_loop():
    device = torch.device(CONFIG["device"])
    if device.type == "cpu":
        torch.set_num_threads(1)  # the smoke run: idle processes' threads would compete
    torch.manual_seed(0)
    build = resnet_loop if CONFIG["loop"] == "resnet18" else mlp_loop
    step = build(device, CONFIG["size"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    from torch.optim import optimizer as optimizer_module

    hello = {
        "id": CONFIG["id"], "pid": os.getpid(),
        "plugin_loaded": "pytest_gputrain.plugin" in sys.modules,
        "probe_hooks": len(optimizer_module._global_optimizer_post_hooks),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
    }
    with Client(CONFIG["address"], family="AF_UNIX",
                authkey=bytes.fromhex(CONFIG["key"])) as conn:
        conn.send(hello)
        while True:
            command, steps = conn.recv()
            if command == "stop":
                return
            conn.send(run(step, sync, steps, CONFIG["item_every"]))
'''


@dataclass
class Process:
    """One pytest process: a loop in a mode."""

    ident: str
    loop: str
    mode: str
    popen: subprocess.Popen[bytes]
    log: Path
    facts: Path
    conn: Connection | None = None
    hello: dict[str, Any] = field(default_factory=dict)
    warmup: float | None = None
    rounds: list[float] = field(default_factory=list)  # seconds per step, one per round


def plugin_autoloads() -> bool:
    """pytest-gputrain is installed with its pytest11 entry point (how users get it)."""
    return any(ep.value.startswith("pytest_gputrain")
               for ep in importlib.metadata.entry_points(group="pytest11"))


def mode_arguments(mode: str, autoload: bool, facts: Path) -> list[str]:
    load = [] if autoload else ["-p", "pytest_gputrain.plugin"]
    if mode == "plain":
        return ["-p", "no:gputrain"] if autoload else []
    if mode == "loaded":
        return load
    return [*load, "--gpu-diagnose", "--gpu-fail-on=never", f"--gpu-facts-out={facts}"]


def launch(workdir: Path, config: dict[str, Any], mode: str, autoload: bool,
           cpus: list[int]) -> Process:
    ident = config["id"]
    facts = workdir / f"facts-{ident}.json"
    log = workdir / f"log-{ident}.txt"
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_PLUGINS")}
    env["GPUTRAIN_OVERHEAD"] = json.dumps(config)
    # This checkout's package, whether or not (and wherever) the plugin is installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-c", str(workdir / "pytest.ini"), "--rootdir", str(workdir),
               *mode_arguments(mode, autoload, facts), str(workdir / "test_overhead_loop.py")]
    with log.open("wb") as stream:
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        popen = subprocess.Popen(command, cwd=workdir, env=env, stdout=stream,
                                 stderr=subprocess.STDOUT, preexec_fn=pin)
    return Process(ident, config["loop"], mode, popen, log, facts)


def connect_all(listener: Listener, processes: list[Process]) -> None:
    """Accept every process's connection (or fail naming a process that died first)."""
    accepted: queue.Queue[Connection] = queue.Queue()

    def accept() -> None:
        for _ in processes:
            try:
                accepted.put(listener.accept())
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    by_id = {process.ident: process for process in processes}
    deadline = time.monotonic() + STARTUP_TIMEOUT
    waiting = len(processes)
    while waiting:
        try:
            conn = accepted.get(timeout=0.5)
        except queue.Empty:
            for process in processes:
                if process.conn is None and process.popen.poll() is not None:
                    raise RuntimeError(
                        failure_text(process, "exited before it connected")) from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"{waiting} process(es) did not connect within "
                                   f"{STARTUP_TIMEOUT:.0f} s") from None
            continue
        hello = conn.recv()
        process = by_id[hello["id"]]
        process.conn, process.hello = conn, hello
        waiting -= 1


def ask(process: Process, command: str, steps: int) -> float:
    conn = process.conn
    assert conn is not None
    conn.send((command, steps))
    if not conn.poll(REPLY_TIMEOUT):
        raise RuntimeError(failure_text(process, f"gave no answer to {command} within "
                                                  f"{REPLY_TIMEOUT:.0f} s"))
    try:
        seconds: float = conn.recv()
    except EOFError:
        raise RuntimeError(failure_text(process, f"died during {command}")) from None
    return seconds


def failure_text(process: Process, what: str) -> str:
    process.popen.poll()
    tail = process.log.read_text(errors="replace")[-3000:] if process.log.exists() else ""
    return (f"{process.ident} ({process.loop}, {process.mode}) {what} "
            f"(exit status {process.popen.returncode}):\n{tail}")


def check_modes(processes: list[Process]) -> None:
    """Each process runs in the mode it was started in (plugin loaded or not, probe or not)."""
    for process in processes:
        loaded, hooks = process.hello["plugin_loaded"], process.hello["probe_hooks"]
        expected = (process.mode != "plain", process.mode == "diagnose")
        if (loaded, hooks > 0) != expected:
            raise RuntimeError(f"{process.ident} runs in the wrong mode: plugin loaded "
                               f"{loaded}, probe hooks {hooks}, expected {process.mode}")


def window_facts(process: Process) -> dict[str, Any]:
    """What the diagnosing process's probe recorded of its profiler window."""
    try:
        runs = json.loads(process.facts.read_text())["runs"]
    except (OSError, ValueError, KeyError):
        return {"captured": None, "reason": "no facts file"}
    if not runs:
        return {"captured": None, "reason": "no run recorded"}
    profile = runs[0].get("profile", {})
    return {key: profile.get(key) for key in
            ("captured", "reason", "cupti_teardown", "cupti_teardown_reason")} | {
        "probe_errors": runs[0].get("probe_errors", [])}


def pooled_median(group: list[Process]) -> float:
    """The median of the rounds of these processes, taken together (a mode's step time)."""
    return statistics.median(t for process in group for t in process.rounds)


def ratio_interval(plain: list[Process], other: list[Process], seed: int,
                   draws: int = BOOTSTRAP_DRAWS) -> tuple[float, float]:
    """The 90 % bootstrap interval of ``other``'s step time over plain's, resampling processes.

    A process is the unit that varies (its cores, its memory layout, its CUDA context), so each
    draw takes as many processes as each mode has, with replacement, and sets the pooled
    median of the drawn processes' rounds against plain's; the 5th and 95th percentiles of the
    draws' ratios bound the interval. A fixed seed prints the same interval for the same rounds.
    """
    rng = random.Random(seed)
    ratios = [pooled_median(rng.choices(other, k=len(other)))
              / pooled_median(rng.choices(plain, k=len(plain))) for _ in range(draws)]
    cuts = statistics.quantiles(ratios, n=20, method="inclusive")  # the 5th ... 95th
    return cuts[0], cuts[-1]


def summarise(processes: list[Process], loop: str, seed: int = 0) -> dict[str, Any]:
    mine = [process for process in processes if process.loop == loop]
    modes: dict[str, Any] = {}
    groups = {mode: [process for process in mine if process.mode == mode] for mode in MODES}
    for mode, group in groups.items():
        modes[mode] = {
            "median_ms": pooled_median(group) * 1e3,
            "rounds_ms": [round(t * 1e3, 4) for process in group for t in process.rounds],
            "process_median_ms": [round(statistics.median(p.rounds) * 1e3, 4) for p in group],
            "warmup_s": [round(p.warmup or 0.0, 3) for p in group],
        }
    plain = modes["plain"]["median_ms"]
    ratios = {mode: modes[mode]["median_ms"] / plain for mode in ("loaded", "diagnose")}
    intervals = {mode: ratio_interval(groups["plain"], groups[mode], seed)
                 for mode in ("loaded", "diagnose")}
    warm_plain = statistics.median(modes["plain"]["warmup_s"])
    per_test = statistics.median(modes["diagnose"]["warmup_s"]) - warm_plain
    windows = [window_facts(p) for p in mine if p.mode == "diagnose"]
    return {"modes": modes, "ratios": ratios, "ratio_intervals_90": intervals,
            "per_test_cost_s": per_test, "windows": windows}


def print_loop(loop: str, sizes: dict[str, int], result: dict[str, Any], item_every: int) -> None:
    size = ", ".join(f"{key} {value}" for key, value in sizes.items()
                     if key not in ("steps", "warmup"))
    print(f"\n{loop} ({size}); loss.item() every {item_every} steps, {sizes['steps']} steps "
          f"a round after a {sizes['warmup']}-step warm-up")
    print(f"  {'mode':9} {'ms/step':>9} {'ratio':>7} {'90 % interval':>15}   "
          f"per process (median ms/step)")
    for mode in MODES:
        data = result["modes"][mode]
        ratio = 1.0 if mode == "plain" else result["ratios"][mode]
        interval = ("" if mode == "plain" else
                    "{:.3f}-{:.3f}".format(*result["ratio_intervals_90"][mode]))
        goal = f"  (goal {GOALS[mode]:.2f})" if mode in GOALS else ""
        processes = " ".join(f"{value:.3f}" for value in data["process_median_ms"])
        print(f"  {mode:9} {data['median_ms']:9.3f} {ratio:7.4f} {interval:>15}   "
              f"{processes}{goal}")
    print(f"  (90 % interval: {BOOTSTRAP_DRAWS} bootstrap draws of the processes of each mode)")
    print(f"  the diagnosis's cost per test (its warm-up minus plain's, the profiler window "
          f"included): {result['per_test_cost_s']:+.2f} s")
    for window in result["windows"]:
        teardown = window.get("cupti_teardown")
        print(f"  profiler window: captured {window['captured']}"
              + (f" ({window['reason']})" if window.get("reason") else "")
              + (f"; CUPTI detached after it: {teardown} ({window['cupti_teardown_reason']})"
                 if teardown is not None else "")
              + (f"; probe errors {window['probe_errors']}" if window.get("probe_errors")
                 else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (default; the issue's sizes) or cpu (tiny sizes)")
    parser.add_argument("--loops", default=",".join(LOOPS),
                        help=f"comma-separated, of {', '.join(LOOPS)} (default both)")
    parser.add_argument("--procs", type=int, default=4,
                        help="processes per mode and loop (default 4: a host-bound loop's "
                             "speed differs from process to process by several %%)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per process (default 2)")
    parser.add_argument("--steps", type=int, help="steps per round (default per loop)")
    parser.add_argument("--warmup", type=int, help="warm-up steps (default per loop; the "
                        "probe's profiler window, steps 3-6, must fall inside)")
    parser.add_argument("--size", action="append", default=[], metavar="LOOP.KEY=N",
                        help="change one size, e.g. mlp.batch=2048 (repeatable; keys as printed)")
    parser.add_argument("--item-every", type=int, default=25,
                        help="steps between two loss.item() calls (default 25)")
    parser.add_argument("--cpus", type=int, default=None,
                        help="pin every process to this many CPUs, the same ones (default 8 "
                             "on cuda; 0: no pinning)")
    parser.add_argument("--seed", type=int, default=0,
                        help="for the round order and the bootstrap intervals")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 when diagnose/plain > {GOALS['diagnose']} or "
                             f"loaded/plain > {GOALS['loaded'] + NOISE}")
    args = parser.parse_args(argv)
    loops = [name.strip() for name in args.loops.split(",") if name.strip()]
    unknown = sorted(set(loops) - set(LOOPS))
    if unknown or not loops:
        parser.error(f"--loops: {', '.join(unknown) or 'none given'}; choose from "
                     f"{', '.join(LOOPS)}")
    if args.cpus is not None and args.cpus < 0:
        parser.error(f"--cpus must be at least 0, got {args.cpus}")
    cpus = cpu_sets(1, args.cpus if args.cpus is not None else
                    8 if args.device == "cuda" else 0)[0]
    for name in ("procs", "rounds", "steps", "item_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")

    started = time.perf_counter()
    sizes = {loop: dict(SIZES[args.device][loop]) for loop in loops}
    for loop in loops:
        if args.steps:
            sizes[loop]["steps"] = args.steps
        if args.warmup:
            sizes[loop]["warmup"] = args.warmup
    for text in args.size:
        name, _, value = text.partition("=")
        loop, _, key = name.partition(".")
        if loop not in sizes or key not in sizes[loop] or not value.isdigit() or int(value) < 1:
            parser.error(f"--size {text!r}: expected LOOP.KEY=N with LOOP one of "
                         f"{', '.join(sizes)}, KEY one of its sizes and N >= 1, e.g. "
                         f"mlp.batch=2048")
        sizes[loop][key] = int(value)
    for loop in loops:
        if sizes[loop]["warmup"] < 8:
            parser.error(f"{loop}: the warm-up must be at least 8 steps (the profiler window "
                         f"ends at step 6, and the step after it is the window's too), got "
                         f"{sizes[loop]['warmup']}")
    autoload = plugin_autoloads()
    rng = random.Random(args.seed)
    processes: list[Process] = []
    with tempfile.TemporaryDirectory(prefix="gputrain-overhead-") as tmp:
        workdir = Path(tmp)
        (workdir / "test_overhead_loop.py").write_text(textwrap.dedent(TEST_SOURCE))
        (workdir / "pytest.ini").write_text("[pytest]\n")
        key = secrets.token_bytes(16)
        address = str(workdir / "control.sock")
        with Listener(address, family="AF_UNIX", authkey=key) as listener:
            try:
                for loop in loops:
                    size = {k: v for k, v in sizes[loop].items() if k not in ("steps", "warmup")}
                    for mode in MODES:
                        for index in range(args.procs):
                            config = {"id": f"{loop}-{mode}-{index}", "loop": loop,
                                      "device": args.device, "size": size,
                                      "item_every": args.item_every, "address": address,
                                      "key": key.hex()}
                            processes.append(launch(workdir, config, mode, autoload, cpus))
                connect_all(listener, processes)
                check_modes(processes)
                for loop in loops:
                    mine = [process for process in processes if process.loop == loop]
                    for process in rng.sample(mine, len(mine)):
                        process.warmup = ask(process, "round", sizes[loop]["warmup"])
                    for _ in range(args.rounds):
                        for process in rng.sample(mine, len(mine)):
                            steps = sizes[loop]["steps"]
                            process.rounds.append(ask(process, "round", steps) / steps)
                    for process in mine:
                        assert process.conn is not None
                        process.conn.send(("stop", 0))
                for process in processes:
                    process.popen.wait(timeout=REPLY_TIMEOUT)
                    if process.popen.returncode != 0:
                        raise RuntimeError(failure_text(process, "failed"))
                results = {loop: summarise(processes, loop, args.seed) for loop in loops}
            finally:
                for process in processes:
                    if process.popen.poll() is None:
                        process.popen.kill()
                        process.popen.wait()
                    if process.conn is not None:
                        process.conn.close()

    elapsed = time.perf_counter() - started
    hello = processes[0].hello
    print(f"--gpu-diagnose overhead on {hello['device_name']} (torch {hello['torch']}, CUDA "
          f"{hello['cuda']}): {args.procs} process(es) per mode and loop, {args.rounds} "
          f"interleaved rounds each; plugin {'autoloaded' if autoload else 'loaded with -p'}; "
          f"{describe_cpus(cpus)}")
    for loop in loops:
        print_loop(loop, sizes[loop], results[loop], args.item_every)
    print(f"\ntook {elapsed:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": args.device, "device_name": hello["device_name"], "torch": hello["torch"],
            "cuda": hello["cuda"], "procs": args.procs, "rounds": args.rounds,
            "item_every": args.item_every, "cpus": cpus, "sizes": sizes, "loops": results,
            "goals": GOALS, "elapsed_s": round(elapsed, 1)}, indent=2) + "\n")
    missed = [f"{loop} {mode} {results[loop]['ratios'][mode]:.4f}" for loop in loops
              for mode in ("loaded", "diagnose")
              if results[loop]["ratios"][mode] > GOALS[mode] + (NOISE if mode == "loaded" else 0)]
    if missed:
        print(f"goal missed: {'; '.join(missed)}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
