"""The payments core: payments and their state machine, the event log, processor attempts, the
ledger, returns, notifications of change, the outbox, the services that write them, the processor
backends, the bank path (``nacha/``) and the vault (``vault/``), and the payments REST API. It
knows nothing of SQS.

Exactly-once ACH payments: the module's version lives here, the one place the distribution's
metadata reads it from (``[tool.setuptools.dynamic]`` in pyproject.toml), so what a host's code
sees as ``payments.__version__`` is what pip installed. Record each release in CHANGELOG.md."""

__version__ = "0.1.0"
