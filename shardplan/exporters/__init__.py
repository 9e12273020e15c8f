"""Exporters: a Plan in the vocabulary of an SPMD engine (DTensor placements, ...).

Each format lives in its own module (`shardplan.exporters.dtensor`, ...) and imports its framework
lazily, so importing this package never needs torch or jax.
"""
