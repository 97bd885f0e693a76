"""The host's own cost of a piece of work: CPU time and, where the kernel allows, instructions.

Both are read for the threads that do a training step's host work (``step_threads``): the
calling thread, and torch's autograd engine threads (``pt_autograd_<device>``), which run a CUDA
backward and launch its kernels. Other threads are left out on purpose: an OpenMP worker
spinning while it waits for work, a sampler, a logger add CPU time that moves with the host's
load, not with the step.

- **CPU time** (per-thread CPU clocks, ``clock_gettime`` of each thread's
  ``CPUCLOCK_SCHED`` clock): the time the threads ran on a core. Time spent waiting for a
  core (a busy host) is not in it, which makes it steadier than a wall clock on a shared
  machine; it still moves with the clock frequency and the neighbours' use of the caches.
- **Instructions** retired in user space by those threads, from a hardware counter
  (``perf_event_open``, called through ``ctypes``: the standard library has no binding). An
  instruction count does not move with the clock frequency or the neighbours' cache traffic,
  so it is the steadiest measure of host work there is (CodSpeed gates CPU code on it for that
  reason). The kernel may refuse: ``perf_event_paranoid`` above 2, a container whose seccomp
  profile blocks the call, a virtual machine without a PMU. Then ``InstructionCounter.open``
  says why, and nothing else changes.

Linux only for the autograd threads and for instructions; elsewhere the calling thread's CPU
time (``time.thread_time_ns``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import threading
import time
from dataclasses import dataclass

# perf_event_open's system call number on the architectures Linux runs on.
SYSCALLS = {"x86_64": 298, "amd64": 298, "aarch64": 241, "arm64": 241, "riscv64": 241,
            "i386": 336, "i686": 336, "armv7l": 364, "ppc64le": 319, "ppc64": 319,
            "s390x": 331, "loongarch64": 241}
PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE = 0, 1
# read_format: each read returns the value, the time the counter was enabled and the time it
# actually counted (they differ when the PMU multiplexes counters: the value is then a share).
PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
# attr.flags bits: exclude_kernel (5) and exclude_hv (6): user space only, which a
# perf_event_paranoid of 2 (the usual default) lets a process count on its own threads.
EXCLUDE_KERNEL = 1 << 5
EXCLUDE_HV = 1 << 6
ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7; the kernel accepts any size it knows
PARANOID = "/proc/sys/kernel/perf_event_paranoid"
AUTOGRAD_THREADS = "pt_autograd_"  # torch names its autograd engine's device threads so
TASKS = "/proc/self/task"


def step_threads() -> list[int]:
    """The native ids of the calling thread and of torch's autograd engine threads."""
    own = threading.get_native_id()
    found = [own]
    try:
        names = os.listdir(TASKS)
    except OSError:
        return found
    for name in names:
        try:
            with open(f"{TASKS}/{name}/comm", encoding="utf-8", errors="replace") as handle:
                comm = handle.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if comm.startswith(AUTOGRAD_THREADS) and int(name) != own:
            found.append(int(name))
    return found


def _thread_clock(thread: int) -> int:
    """The clock id of a thread's CPU time (Linux's MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED))."""
    return (~thread << 3) | 6


def cpu_time_ns(threads: list[int] | None = None) -> int:
    """The CPU time so far of ``threads`` (native ids; default: the calling thread), in
    nanoseconds; a thread that ended adds what it had no longer."""
    if threads is None or platform.system() != "Linux":
        return time.thread_time_ns()
    total = 0
    for thread in threads:
        try:
            total += time.clock_gettime_ns(_thread_clock(thread))
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class Event:
    """What a counter counts: perf's event type and config."""

    type: int
    config: int
    name: str


INSTRUCTIONS = Event(PERF_TYPE_HARDWARE, 1, "instructions")  # PERF_COUNT_HW_INSTRUCTIONS
# PERF_COUNT_SW_TASK_CLOCK (nanoseconds on a core): a software event, there without a PMU; the
# tests count it to check the counters themselves where the hardware has none.
TASK_CLOCK = Event(PERF_TYPE_SOFTWARE, 1, "task clock")


def _attr(event: Event) -> bytes:
    """``struct perf_event_attr`` for ``event`` in user space, counting from the start."""
    head = struct.pack("=IIQQQQQ", event.type, ATTR_SIZE, event.config, 0, 0,
                       PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING,
                       EXCLUDE_KERNEL | EXCLUDE_HV)
    return head + bytes(ATTR_SIZE - len(head))


def _paranoid() -> str:
    try:
        with open(PARANOID, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return "unknown"


def _refusal(code: int) -> str:
    """Why perf_event_open failed, in words a user can act on."""
    text = os.strerror(code)
    if code in (errno.EACCES, errno.EPERM):
        return (f"perf_event_open was refused ({text}; {PARANOID} is {_paranoid()}: counting "
                "one's own user-space instructions needs 2 or less, and a container's seccomp "
                "profile may refuse the call whatever it is)")
    if code in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV):
        return (f"the kernel exposes no hardware instruction counter ({text}: a virtual machine "
                "without a virtual PMU, or a CPU perf does not know)")
    if code == errno.ENOSYS:
        return "this kernel has no perf_event_open"
    if code == errno.EMFILE:
        return f"no file descriptor left for a counter ({text})"
    return f"perf_event_open failed ({text})"


@dataclass(frozen=True)
class Reading:
    """The count so far over the counted threads; ``multiplexed`` when some counter shared the
    PMU with others and its value is an estimate."""

    value: int
    multiplexed: bool


class InstructionCounter:
    """User-space instructions of some threads of this process, one counter per thread.

    ``InstructionCounter.open()`` returns the counter or the reason there is none; ``read()``
    the count so far; ``close()`` frees the counters (also on ``with``)."""

    def __init__(self, descriptors: list[int]) -> None:
        self._descriptors = descriptors

    @classmethod
    def open(cls, event: Event = INSTRUCTIONS, threads: list[int] | None = None
             ) -> InstructionCounter | str:
        """Counters of ``event`` on ``threads`` (native ids; default ``step_threads()``)."""
        if platform.system() != "Linux":
            return f"instructions are counted on Linux only (this is {platform.system()})"
        number = SYSCALLS.get(platform.machine().lower())
        if number is None:
            return f"no perf_event_open number known for {platform.machine()}"
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            syscall = libc.syscall
        except (OSError, AttributeError) as exc:
            return f"the C library's syscall() cannot be called: {exc}"
        syscall.restype = ctypes.c_long
        attr = ctypes.create_string_buffer(_attr(event), ATTR_SIZE)
        if threads is None:
            threads = step_threads()
        descriptors: list[int] = []
        for thread in threads:
            # pid = the thread, cpu = -1 (wherever it runs), no group, no flags
            fd = syscall(ctypes.c_long(number), attr, ctypes.c_int(thread), ctypes.c_int(-1),
                         ctypes.c_int(-1), ctypes.c_ulong(0))
            if fd < 0:
                code = ctypes.get_errno()
                if code == errno.ESRCH:  # the thread ended meanwhile
                    continue
                for opened in descriptors:
                    os.close(opened)
                return _refusal(code)
            descriptors.append(int(fd))
        if not descriptors:
            return "no thread of this process could be counted"
        return cls(descriptors)

    @property
    def threads(self) -> int:
        return len(self._descriptors)

    def read(self) -> Reading:
        total, multiplexed = 0, False
        for fd in self._descriptors:
            value, enabled, running = struct.unpack("=QQQ", os.read(fd, 24))
            if running < enabled:
                multiplexed = True
                value = int(value * enabled / running) if running else 0
            total += value
        return Reading(total, multiplexed)

    def close(self) -> None:
        while self._descriptors:
            os.close(self._descriptors.pop())

    def __enter__(self) -> InstructionCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
