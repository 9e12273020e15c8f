"""Convolutional models (placeholder module; builders are being written)."""
