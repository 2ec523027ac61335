"""Experiments, pure but for one live room: experiment files -> cells (``experiment``), what a cell is
(``cell_kinds``), the results folder and its resume rule (``folder``), progress lines (``progress``), the report
(``report``); the loop of ``emu run`` over networks and cells (``live``)."""
