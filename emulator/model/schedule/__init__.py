"""Schedules of collectives as data: the format, what each collective means, its proof and its composition.

Pure Python, no root. Modules:

* :mod:`~emulator.model.schedule.format` -- dataclasses, validation, YAML/JSON files, sizes
* :mod:`~emulator.model.schedule.semantics` -- what each collective means: inputs, results, bus bandwidth
* :mod:`~emulator.model.schedule.deps` -- data hazards and derived dependencies
* :mod:`~emulator.model.schedule.dispatch` -- the agents' dispatch rules, shared with the proof and the timing model
* :mod:`~emulator.model.schedule.executor` -- symbolic execution (the proof, deadlocks)
* :mod:`~emulator.model.schedule.compose` -- several collectives as one schedule (segments, process groups)
* :mod:`~emulator.model.schedule.buffers` -- the agents' buffers and the data check

Who makes schedules: :mod:`emulator.model.collectives` (one collective's
algorithms, MSCCL files), :mod:`emulator.model.workloads` (training
iterations, Chakra traces); who predicts them: :mod:`emulator.model.prediction`.
The file format is documented in ``docs/schedule-format.md``.
"""
