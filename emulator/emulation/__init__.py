"""The live edges, one room a job (layers, top down): ``mpi`` (``emu mpirun``), ``session`` (``emu replay``,
fault injection, fidelity), ``cluster`` (several servers), ``network`` (bring-up) and ``agents`` (the host
agents), ``machine`` (this machine underneath)."""
