"""``emu mpirun``: Open MPI programs over the emulated fabric, the bundled ``emu-allreduce-bench`` and the latency
library preloaded into every rank."""
