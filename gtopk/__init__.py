"""gTop-k S-SGD benchmark-and-reproduction harness."""

__version__ = "0.1.0"
