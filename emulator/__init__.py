"""Packet-level network emulator for distributed deep-learning training.

Its folders are its layers, from the command line down to the plumbing; each
imports only the folders below it (``setup.cfg``'s import-linter contracts,
run by ``make lint``; ``docs/architecture.md`` draws them):

- :mod:`emulator.cli`: ``emu`` and its subcommands;
- :mod:`emulator.study` (experiments: files, runner, run folders, report) and
  :mod:`emulator.selfcheck` (calibration, the benchmark, captures), side by side;
- :mod:`emulator.emulation`: the live edges (network, controller process,
  agents, replays, MPI runs), each taking its command runner as a parameter;
- :mod:`emulator.runs`: a run as data (plans, admission, results, metrics), pure;
- :mod:`emulator.model`: topologies, routing, fabrics, schedules and the timing
  model, pure;
- :mod:`emulator.base`: errors, files, waiting, names, statistics, pure.
"""

__version__ = "0.1.0"
