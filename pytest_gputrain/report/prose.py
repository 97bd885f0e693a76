"""A finding's words as the HTML report shows them: Markdown rendered, references as links.

Rule files write their message, fix and why in Markdown (``torch.no_grad()`` in backticks,
lists of steps). markdown-it-py renders them, CommonMark as written, with raw HTML turned off
(a ``<script>`` in a rule or a fact arrives as text) and images off; a link is kept only when it
goes to an ``http``/``https`` address or an anchor of the page (no ``javascript:``, ``data:``
or ``file:``). A reference is a bare address: it becomes a link under the same check.

Imported only when an HTML report is written (``report/html.py``): a plain pytest run does not
load markdown-it-py. docs/report-html.md says why it was chosen.
"""

from __future__ import annotations

import functools
import re
from html import escape
from typing import Any

from markupsafe import Markup

SAFE_LINK = re.compile(r"(?:https?://|#)[^\s<>\"'`]*\Z", re.IGNORECASE)
_URL = re.compile(r"https?://[^\s<>\"'`]+", re.IGNORECASE)
_TRAILING = ".,;:!?)]}"  # punctuation that ends a sentence, not the address


def safe_link(url: str) -> bool:
    """Whether the page may link to ``url``: an http(s) address or an anchor of the page."""
    return SAFE_LINK.match(url.strip()) is not None


@functools.cache
def _renderer() -> Any:
    from markdown_it import MarkdownIt

    markdown = MarkdownIt("commonmark", {"html": False, "linkify": False,
                                         "typographer": False})
    markdown.disable(["image"])
    markdown.validateLink = safe_link  # type: ignore[method-assign]  # others stay text

    def link_open(renderer: Any, tokens: Any, index: int, options: Any, env: Any) -> str:
        tokens[index].attrSet("rel", "noopener noreferrer")
        return str(renderer.renderToken(tokens, index, options, env))

    markdown.add_render_rule("link_open", link_open)
    return markdown


@functools.lru_cache(maxsize=4096)  # a rule's text repeats on every test it fires on
def markdown_html(text: str) -> Markup:
    """``text`` (Markdown) as HTML paragraphs, lists and code."""
    if not text:
        return Markup("")
    return Markup(_renderer().render(text))


@functools.lru_cache(maxsize=4096)
def markdown_inline(text: str) -> Markup:
    """``text`` (Markdown) as HTML without a paragraph around it (a title, a table cell)."""
    if not text:
        return Markup("")
    return Markup(_renderer().renderInline(text))


def linked(text: str) -> Markup:
    """Plain ``text`` escaped, with each http(s) address in it made a link."""
    parts: list[str] = []
    last = 0
    for match in _URL.finditer(text):
        url = match.group().rstrip(_TRAILING)
        start, end = match.start(), match.start() + len(url)
        parts.append(escape(text[last:start]))
        parts.append(f'<a href="{escape(url)}" rel="noopener noreferrer">{escape(url)}</a>')
        last = end
    parts.append(escape(text[last:]))
    return Markup("".join(parts))
