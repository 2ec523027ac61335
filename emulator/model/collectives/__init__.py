"""Collective algorithms, one registration each (``registry``): their generators (``algorithms``, on the building
blocks of ``blocks``), rank placements (``placements``), closed-form costs (``formulas``), and ``generate``
(``generators``); MSCCL's algorithm files (``msccl``)."""
