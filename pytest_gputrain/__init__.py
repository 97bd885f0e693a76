"""pytest-gputrain: GPU assertions, regression gates and diagnosis for GPU training tests."""

__version__ = "0.1.0"
