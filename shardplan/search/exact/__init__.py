"""Exact searches over the per-round strategy space (`space.py`, `round_split.py`): the ILP
(`ilp.py`, HiGHS) and the OptCNN-style DP by graph elimination (`dp.py`)."""
