"""Shared test helpers: recorded fact sets and a way to make the plugin 'see' them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

# The PostgreSQL store's tests share one real server (tests/postgres_server.py).
from postgres_server import postgres_server, postgres_url  # noqa: F401
from recorded_facts import load_fact_set

# pytester's in-process runs forget modules first imported inside them, and torch cannot be
# imported twice in one process: import it, and the plugin's lazily loaded modules, up front.
try:
    import torch
except ImportError:
    torch = None
import pytest_gputrain.collect
import pytest_gputrain.diagnosis
import pytest_gputrain.distributed.facts
import pytest_gputrain.distributed.launcher
import pytest_gputrain.engine.evaluate
import pytest_gputrain.probe.facts
import pytest_gputrain.probe.failures
import pytest_gputrain.probe.run
import pytest_gputrain.report.markdown
import pytest_gputrain.report.terminal  # noqa: F401

try:  # history --png draws with pyplot: a copy forgotten by an in-process run breaks the next
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
except ImportError:
    pass


def _import_torch_lazy_modules() -> None:
    """torch imports some modules on first use (an optimizer step pulls in torch._dynamo, which
    registers operator libraries); a first use inside an in-process pytester run would import
    them there, forget them after, and fail to register them again in the next run."""
    if torch is None:
        return
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x,) in DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2):
        model(x).sum().backward()
        optimizer.step()
    torch.compiler.is_compiling()


_import_torch_lazy_modules()



def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """pyproject.toml's addopts (`-m 'not slow'`) deselect the tests that train for minutes: say
    so beside the "N deselected" count, with the command that runs them."""
    slow = [item for item in terminalreporter.stats.get("deselected", [])
            if isinstance(item, pytest.Item) and item.get_closest_marker("slow")]
    if slow:
        terminalreporter.write_line(
            f"{len(slow)} slow test(s) left out by `-m 'not slow'` (pyproject.toml's addopts); "
            "run them with `pytest -m slow`")


def patch_facts(data: dict[str, Any], set_: dict[str, Any] | None = None,
                unset: list[str] | None = None) -> dict[str, Any]:
    """Assign dotted paths inside data['environment'] ('devices.0.memory_used' = 1)."""
    for path, value in list((set_ or {}).items()) + [(p, None) for p in (unset or [])]:
        target: Any = data["environment"]
        *parents, last = path.split(".")
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            if last not in target:
                raise KeyError(f"no fact {path!r} in the recorded set")
            target[last] = value
    return data


@pytest.fixture
def use_facts(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """Make in-process pytester runs diagnose a recorded fact set instead of this machine."""
    from pytest_gputrain import collect
    from pytest_gputrain.facts import FactsFile

    def install(name: str, set_: dict[str, Any] | None = None,
                unset: list[str] | None = None) -> Any:
        data = patch_facts(load_fact_set(name), set_, unset)
        environment = FactsFile.model_validate(data).environment
        monkeypatch.setattr(collect, "collect_environment", lambda **_: environment.model_copy())
        return environment

    return install
