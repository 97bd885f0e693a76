"""The Python bytecode counter of the counting pass (``collect.bytecodes``): exact, the step's
own thread only, named by function, and it gives way to a tracer it would displace."""

from __future__ import annotations

import sys
import threading

import pytest

from pytest_gputrain.collect import bytecodes


def work(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i * i
    return total


def test_the_same_step_counts_the_same_every_time() -> None:
    found = bytecodes.count_bytecodes(lambda: work(300), 3)
    assert not isinstance(found, str)
    assert len(found) == 3 and len({s.total for s in found}) == 1
    assert found[0].total == sum(found[0].by_function.values())


def test_a_bigger_loop_counts_more_in_its_own_function() -> None:
    small = bytecodes.count_bytecodes(lambda: work(100), 1)
    large = bytecodes.count_bytecodes(lambda: work(1100), 1)
    assert not isinstance(small, str) and not isinstance(large, str)
    name = next(n for n in large[0].by_function if n.startswith("work (test_bytecodes.py:"))
    grown = large[0].by_function[name] - small[0].by_function[name]
    assert grown % 1000 == 0 and grown >= 4000  # the same instructions per iteration
    assert large[0].total - small[0].total == grown  # nothing else moved


def test_another_threads_python_is_not_counted() -> None:
    alone = bytecodes.count_bytecodes(lambda: work(2000), 1)
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            work(50)

    neighbour = threading.Thread(target=busy)
    neighbour.start()
    try:
        beside = bytecodes.count_bytecodes(lambda: work(2000), 2)
    finally:
        stop.set()
        neighbour.join()
    assert not isinstance(alone, str) and not isinstance(beside, str)
    assert [s.total for s in beside] == [alone[0].total] * 2


def test_the_steps_exception_propagates_and_leaves_no_counting_behind() -> None:
    with pytest.raises(ZeroDivisionError):
        bytecodes.count_bytecodes(lambda: 1 / 0, 2)
    if sys.version_info >= (3, 12):
        assert all(sys.monitoring.get_tool(i) is None for i in bytecodes.FREE_TOOL_IDS)
    else:
        assert sys.gettrace() is None


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12+ counts with sys.monitoring, "
                    "beside any tracer")
def test_before_312_a_tracer_in_place_is_kept_and_the_reason_given() -> None:
    def tracer(frame: object, event: str, arg: object) -> None:
        return None

    held = sys.gettrace()
    sys.settrace(tracer)
    try:
        found = bytecodes.count_bytecodes(lambda: work(10), 1)
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(held)
    assert isinstance(found, str) and "already traced" in found and "tracer" in found


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is Python 3.12+")
def test_from_312_taken_tool_ids_are_left_to_their_owners() -> None:
    taken = [i for i in bytecodes.FREE_TOOL_IDS if sys.monitoring.get_tool(i) is None]
    for i in taken:
        sys.monitoring.use_tool_id(i, "someone else")
    try:
        found = bytecodes.count_bytecodes(lambda: work(10), 1)
    finally:
        for i in taken:
            sys.monitoring.free_tool_id(i)
    assert isinstance(found, str) and "taken by other tools" in found
