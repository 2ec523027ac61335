"""One emulation over several servers (Mininet Cluster Edition): ssh, the cluster-wide lock, the bring-up, agents on
other servers, ``emu cluster check``'s probes."""
