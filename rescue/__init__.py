"""rescue: unbiased replacements for outcome-dependent exclusion in asynchronous agentic RL.

The core (this package minus ``rescue.miles`` and ``rescue.slime``) depends on numpy only
and never imports a training framework, torch or Docker.
"""

__version__ = "0.1.0"
