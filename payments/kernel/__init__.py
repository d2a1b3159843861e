"""The shared kernel: what every app of the module builds on and no feature is in. The typed
settings machinery (``app_settings``, ``setting_specs``), the log lines' format and context
(``logformat``, ``logcontext``) and the bank-number redaction they apply (``bank_numbers``),
trace propagation across the queue (``propagation``) and the database's advisory locks
(``locks``). Nothing here imports a module of the apps outside this package
(``tests/test_dependency_direction.py``)."""
