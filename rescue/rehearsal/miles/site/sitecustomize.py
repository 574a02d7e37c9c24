"""Loaded by every Python process of a CPU rehearsal (this folder is first on PYTHONPATH).

With ``RESCUE_REHEARSAL_DIR`` set it installs ``rescue.rehearsal.miles.changes``' import hook;
otherwise it does nothing.
"""

import os

if os.environ.get("RESCUE_REHEARSAL_DIR"):
    from rescue.rehearsal.miles.changes import install

    install()
