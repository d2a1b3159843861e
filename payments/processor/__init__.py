"""The processor integration: the backend interface every processor is spoken to through
(``backend.py``, named by ``PROCESSOR_BACKEND``), the backends the module ships
(``backends/``: ``http``, the reference API's client, and ``example``, a worked example to copy),
the event contract a callback is parsed into (``contract.py``) and the circuit breaker that
judges the processor by what its backend returns (``breaker/``). The bank-direct backend is
the bank app's (``bank.nacha.backend``)."""
