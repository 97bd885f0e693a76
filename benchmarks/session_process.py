"""One benchmark session in a process of its own, as CI runs each side of a comparison: the
session's function runs in a new process of a multiprocessing context, and its answer (a dict)
comes back through a pipe with the session's wall time; a session that fails or hangs is an
error naming it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

SESSION_TIMEOUT_S = 300.0

Session = Callable[[dict[str, Any]], dict[str, Any]]


def _entry(session: Session, spec: dict[str, Any], connection: Any) -> None:
    try:
        connection.send({"ok": True, **session(spec)})
    except BaseException as exc:
        connection.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        connection.close()


def run_in_process(context: Any, session: Session, spec: dict[str, Any], name: str
                   ) -> dict[str, Any]:
    """``session(spec)`` in a new process of ``context``; its answer and ``wall`` (seconds).
    RuntimeError naming the session ``name`` when it fails or sends nothing in time."""
    receiver, sender = context.Pipe(duplex=False)
    started = time.perf_counter()
    process = context.Process(target=_entry, args=(session, spec, sender))
    process.start()
    sender.close()
    answer: dict[str, Any] = {"ok": False, "error": "the session process sent nothing"}
    if receiver.poll(SESSION_TIMEOUT_S):
        with contextlib.suppress(EOFError):
            answer = receiver.recv()
    else:
        answer["error"] = f"the session did not finish in {SESSION_TIMEOUT_S:g} s"
        process.kill()
    process.join(30)
    answer["wall"] = time.perf_counter() - started
    if not answer.get("ok"):
        raise RuntimeError(f"session {name} failed: {answer.get('error')} "
                           f"(exit code {process.exitcode})")
    return answer
