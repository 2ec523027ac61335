"""The study's one live room: the loop of ``emu run`` over every network and cell (everything else in the study is
pure)."""
