"""The results folder of ``emu run``: its layout, what it says about each cell, its resume rule, and a cell's entry in
``state.json``."""
