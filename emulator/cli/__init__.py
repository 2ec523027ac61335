"""The command line: ``emu``, its argument types and its subcommands."""
