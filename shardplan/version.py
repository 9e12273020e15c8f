"""The package version (one home: `shardplan.__version__` and `shardplan --version` read it)."""

__version__ = "0.1.0"
