"""Exact searches over the per-round strategy space (`space.py`) and its pairwise cost model
(`model.py`, `round_split.py`): the ILP (`ilp.py`, HiGHS) and the OptCNN-style DP by graph
elimination (`dp.py`)."""
