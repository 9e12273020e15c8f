"""Fidelity: does a plan hold up on a real SPMD engine? Numerics against the unsharded run and
the collectives XLA inserts against the cost model (`verify.verify_plan`), and the verdict of a
distributed torch run (`torch.verify_torch`). Frameworks are imported lazily.
"""
