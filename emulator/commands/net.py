"""``emu up`` and ``emu clean`` (filled in by the bring-up work)."""


def register(subparsers):
    pass
