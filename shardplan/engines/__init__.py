"""Backends: run a graph (and a plan's layouts) on a real SPMD engine and measure its collectives.

Each engine lives in its own module (`shardplan.engines.jax`, ...) and imports its framework
lazily, so importing this package never needs jax or torch.
"""
