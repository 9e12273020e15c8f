"""The training step: the search over pipeline stages, micro-batches, levers and stage plans
(`search.py`), the hand recipes scored by the same step model (`recipes.py`), and the stage
partitioning both share (`stages.py`)."""
