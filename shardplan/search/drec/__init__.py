"""D-Rec: the double-recursive search (`search.py`), its round pricer (`costs.py` prices a round's
cuts on `ledger.py`'s state of the rounds done, from `tables.py`'s tables of the graph),
the flexible-edge graph (`flex.py`), repeated-layer folding (`fold.py`), the baselines it must
beat (`baselines.py`) and the memory-aware driver the `drec` solver runs (`driver.py`)."""

from shardplan.search.drec.search import drec

__all__ = ["drec"]
