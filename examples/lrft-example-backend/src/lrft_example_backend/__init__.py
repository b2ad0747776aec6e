"""An example third-party lrft backend: each class delegates to one of lrft's own backends and is
proved by lrft's conformance suites (see ``tests/test_example_backend.py``)."""

from lrft_example_backend.engine import ExampleEngine
from lrft_example_backend.sync import ExampleSync
from lrft_example_backend.train import ExampleTrainBackend

__all__ = ["ExampleEngine", "ExampleSync", "ExampleTrainBackend"]
