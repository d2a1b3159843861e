"""The books: the bank's BAI2 statements imported (``bai2``), matched against what was sent and
booked (``services``), each banking day closed per merchant and currency with its variances
shown to a person and never plugged (``selectors``, ``admin``), and their gauges
(``monitoring``)."""
