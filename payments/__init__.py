"""Exactly-once ACH payments: the module's version lives here, the one place the distribution's
metadata reads it from (``[tool.setuptools.dynamic]`` in pyproject.toml), so what a host's code
sees as ``payments.__version__`` is what pip installed. Record each release in CHANGELOG.md."""

__version__ = "0.1.0"
