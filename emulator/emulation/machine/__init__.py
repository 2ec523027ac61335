"""This machine underneath every run: running commands, what a run started and ``emu clean``, confinement, the
calibration file, the one-network lock."""
