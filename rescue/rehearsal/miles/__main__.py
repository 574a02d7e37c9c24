"""``python -m rescue.rehearsal.miles``: see ``rescue.rehearsal.miles.run``."""

import sys

from rescue.rehearsal.miles.run import main

sys.exit(main())
