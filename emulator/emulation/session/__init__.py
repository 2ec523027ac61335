"""A session on an emulated network: ``emu replay`` (network, controller and agents together), fault injection, and
fidelity (what says whether a measurement can be trusted)."""
