"""The error rescue raises for bad input.

``InputError`` is raised wherever rescue rejects something a user or a caller gave it: a
flag, an environment setting, a hook parameter, a field of a sample or a dump, an array
of the wrong shape. Its message names what was wrong and the allowed values. It is a
``ValueError``, so code that catches ``ValueError`` keeps working.

The ``rescue`` command prints an ``InputError`` as one line (exit status 2); any other
exception, a ``ValueError`` from numpy included, keeps its traceback: it is a bug to
report, not an input to fix.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input to rescue: the message names the flag, field or setting and what is allowed."""
