"""A run as data, pure: what a run asks for (fault plans, MPI plans, admission) and what it measured (results, metrics)."""
