"""The fact names each rule scope may use, so a typo in a rule file is caught at load time."""

from __future__ import annotations

from functools import cache

from pytest_gputrain.facts import DeviceFacts, EnvironmentFacts, device_namespace, session_namespace


@cache
def scope_names(scope: str) -> frozenset[str]:
    env = EnvironmentFacts()
    if scope == "session":
        return frozenset(session_namespace(env))
    if scope == "device":
        return frozenset(device_namespace(env, DeviceFacts()))
    if scope == "distributed":
        from pytest_gputrain.distributed.facts import distributed_vocabulary

        return distributed_vocabulary()
    from pytest_gputrain.run_facts import failure_vocabulary, run_vocabulary

    return run_vocabulary() if scope == "run" else failure_vocabulary()
