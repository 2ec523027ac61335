"""The self-check's live room: ``emu calibrate`` (with its intrinsic-latency probe) and ``emu bench``'s sections that
bring up networks (its cases, rows, results and report are pure, in ``bench/``)."""
