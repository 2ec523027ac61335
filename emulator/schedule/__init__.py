"""Allreduce schedules as data: format, generators, symbolic proof, contention and cost, importers.

Pure Python, no root. Modules:

* :mod:`~emulator.schedule.format` -- dataclasses, validation, YAML/JSON files, sizes
* :mod:`~emulator.schedule.deps` -- data hazards and derived dependencies
* :mod:`~emulator.schedule.generators` -- ring, hd, hdrm, dbtree, hier; placements
* :mod:`~emulator.schedule.executor` -- symbolic execution (allreduce proof, deadlocks)
* :mod:`~emulator.schedule.cost` -- flows per link per step, alpha-beta and max-min models
* :mod:`~emulator.schedule.check` -- all of the above as one report
* :mod:`~emulator.schedule.msccl`, :mod:`~emulator.schedule.chakra` -- importers

The file format is documented in ``docs/schedule-format.md``.
"""
