"""Packet-level network emulator for distributed deep-learning training.

The package is split into a pure core (topology models, routing, schedules,
cost models, analysis), which imports neither Mininet nor os-ken and runs
without root, and thin edges (Mininet bring-up, tc, ovs-vsctl, the os-ken
controller app, host agents) that take their command runner as a parameter.
The layering is held by import-linter contracts (``setup.cfg``, run by
``make lint``): the core imports nothing live, only the command line imports
:mod:`emulator.cli` and :mod:`emulator.commands`, and :mod:`controllers` is
imported only where the controller is launched.
"""

__version__ = "0.1.0"
