"""The form of a rule code, shared by the rule files (rules.py) and the settings that name codes
(config.py), so neither imports the other for it: config.py checks settings at pytest start-up,
before any rule loads. Imports nothing from the package.
"""

from __future__ import annotations

import re

# Every rule's code, shipped or a project's: GT and three digits (project rules use GT9xx).
CODE_RE = re.compile(r"^GT[0-9]{3}$")

__all__ = ["CODE_RE"]
