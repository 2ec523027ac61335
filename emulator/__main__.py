"""``python -m emulator`` runs the ``emu`` command line."""

import sys

from emulator.cli import main

sys.exit(main())
