"""What "fits the terminal" means in the tests of the plugin's and the CLI's text."""

from __future__ import annotations

from pytest_gputrain.report.text import is_url

# pytest's own header lines, which the plugin does not write (the plugins line lists every
# installed plugin on one line).
PYTEST_OWN = ("platform ", "plugins: ", "rootdir: ", "configfile: ", "cachedir: ")


def too_wide(text: str, width: int = 80) -> list[str]:
    """The lines of ``text`` wider than ``width``, less pytest's own header lines; a line that
    is one URL (a list item's included) cannot be broken and is allowed."""
    return [line for line in text.splitlines() if len(line) > width
            and not line.startswith(PYTEST_OWN)
            and not (len(line.removeprefix("- ").split()) == 1
                     and is_url(line.removeprefix("- ").strip()))]
