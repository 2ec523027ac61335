"""The emulator watching itself: the benchmark's cases, rows and report (``bench``) and packet-capture analysis
(``capture_analysis``), pure; calibration, the intrinsic-latency probe and the bench's sections on live networks
(``live``)."""
