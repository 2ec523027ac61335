"""The model held against real clusters: published nccl-tests tables (``tables/``, each with its source), read into
typed tables (:mod:`.tables`), predicted size by size and judged per regime (:mod:`.check`), and drawn
(:mod:`.plots`). Pure but for reading the tables and writing the plots."""
