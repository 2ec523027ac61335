"""The subcommands of ``emu``: one module per group, each adding its parsers and running its command.

A command checks its arguments first (bad input is one line and exit status
2, before anything starts) and only then imports the live module that does
the work (bench, calibrate, analyze, the network, the controller), inside
the command function. That import is not there to dodge a cycle (nothing
below imports the command line; ``setup.cfg``'s contracts hold it): it keeps
``emu --help`` and the argument checks from loading the live side, and lets
the CLI fuzz tests replace those modules' entry points before a command
looks them up.
"""
