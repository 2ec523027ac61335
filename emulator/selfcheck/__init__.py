"""The emulator watching itself: calibration, the intrinsic-latency probe, the benchmark, packet-capture analysis."""
