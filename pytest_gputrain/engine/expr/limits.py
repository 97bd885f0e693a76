"""The bounds that keep hostile rule text cheap: lengths, nesting, digits, list sizes.

Every layer of the language enforces some of them, so they sit at the bottom. Imports nothing
from the package.
"""

from __future__ import annotations

from typing import Final

MAX_LENGTH: Final = 4000  # characters in one condition or placeholder
MAX_DEPTH: Final = 64  # nesting levels; bounds recursion in the parser and the evaluator alike
MAX_DIGITS: Final = 400  # digits in one number literal (and in round()'s ndigits)
MAX_ITEMS: Final = 1000  # elements of a list literal / arguments of a call
MAX_BITS: Final = 1400  # integer results: a little over MAX_DIGITS decimal digits
MAX_STRING: Final = 100_000  # characters in a string result ('+' is the only op that grows one)
