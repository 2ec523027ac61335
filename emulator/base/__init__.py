"""Plumbing every layer uses, pure: one-line errors, atomic files, the polling loop, names, statistics."""
