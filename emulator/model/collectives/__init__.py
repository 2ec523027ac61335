"""Collective algorithms: the generators of every NCCL collective, rank placements, and MSCCL's algorithm files."""
