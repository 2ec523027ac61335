"""``python -m emulator`` runs the ``emu`` command line."""

import sys

from emulator.cli.main import main

sys.exit(main())
