"""The processor integration: the HTTP client (``client.py``)."""
