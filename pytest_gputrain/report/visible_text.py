"""Text we did not write (a test id, a failure's message, a device name, a run's name), shown on
a page we write: as itself, never acted on.

``units.printable`` is the one filter of what is shown: terminal controls and the invisible
marks that reorder or hide text (bidirectional overrides and isolates, zero-width characters)
written out as ``\\u202e``. The terminal applies it; so does every page:

- **HTML** (the report, the history site): :func:`page_environment` is the one Jinja2
  environment of our pages. Every value a template outputs passes ``printable`` (the
  environment's ``finalize``) before autoescaping, and so does every string of the data the
  page's scripts draw (``tojson``, through the environment's JSON policy). HTML built in
  Python (an SVG's labels, pytest-html's extra) uses :func:`html_text`. The templates need do
  nothing: a template that outputs a value shows it safely.
- **Markdown** (the report, the gate's summary): a GitHub step summary renders Markdown as
  HTML, raw HTML included, so :func:`markdown_document` writes ``&``, ``<`` and ``>`` as
  entities (a test id ``<img src=x onerror=…>`` shows as text), as well as ``printable``.
"""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from pytest_gputrain.units import printable

if TYPE_CHECKING:
    import jinja2


def visible(value: Any) -> Any:
    """A template's output value with its text shown as itself: a string through
    ``printable``; markup we built (``|safe``: inlined scripts, an SVG) as it is."""
    if isinstance(value, Markup) or not isinstance(value, str):
        return value
    return printable(value)


def visible_data(value: Any) -> Any:
    """JSON-ready ``value`` (a page's data) with every string, keys too, through
    ``printable``."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {visible_data(key): visible_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [visible_data(item) for item in value]
    return value


def _dumps(value: Any, **options: Any) -> str:
    return json.dumps(visible_data(value), **options)


def page_environment(package: str, folder: str = "templates") -> jinja2.Environment:
    """The Jinja2 environment of a page's templates in ``package``/``folder``: HTML
    autoescaped, an undefined name an error, and every value and every string of the data
    shown as itself (the module's docstring)."""
    import jinja2  # loaded for pages only: Markdown needs none of it

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader(package, folder), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        finalize=visible)
    environment.policies["json.dumps_function"] = _dumps
    return environment


def html_text(text: str) -> str:
    """``text`` for HTML built in Python: ``printable``, then escaped (quotes included)."""
    return html.escape(printable(text))


_HTML_SPECIAL = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def markdown_document(text: str) -> str:
    """A whole Markdown document as it may be shown: ``printable``, and no character that
    starts HTML (``&``, ``<``, ``>`` as entities). Applied once, to the finished document:
    our Markdown writes no HTML of its own."""
    return printable(text).translate(_HTML_SPECIAL)
