"""A run as data, pure: what a run asks for (fault plans, MPI plans, admission, the dilation) and what it measured
(results, metrics, the network probe's verdict)."""
