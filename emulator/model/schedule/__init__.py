"""Allreduce schedules as data: format, generators, symbolic proof, contention and cost, importers.

Pure Python, no root. Modules:

* :mod:`~emulator.model.schedule.format` -- dataclasses, validation, YAML/JSON files, sizes
* :mod:`~emulator.model.schedule.deps` -- data hazards and derived dependencies
* :mod:`~emulator.model.schedule.generators` -- ring, hd, hdrm, dbtree, hier; placements
* :mod:`~emulator.model.schedule.executor` -- symbolic execution (allreduce proof, deadlocks)
* :mod:`~emulator.model.schedule.cost` -- flows per link per step, alpha-beta and max-min models
* :mod:`~emulator.model.schedule.check` -- all of the above as one report
* :mod:`~emulator.model.schedule.msccl`, :mod:`~emulator.model.schedule.chakra` -- importers

The file format is documented in ``docs/schedule-format.md``.
"""
