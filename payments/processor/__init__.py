"""The processor integration: the backend interface every processor is spoken to through
(``backend.py``, named by ``PROCESSOR_BACKEND``), the reference backend, an HTTP client
(``client.py``), the event contract a callback is parsed into (``contract.py``) and the circuit
breaker that judges the processor by what its backend returns (``breaker/``)."""
