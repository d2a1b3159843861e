"""Bank-direct origination: NACHA files written for the ODFI and read back from it.

``layouts`` holds the record layouts as data, ``parser`` reads a file whole or refuses it whole,
``writer`` builds files from submitted debits. Nothing here imports SQS or the database layer
of other apps: the modules that move files and events build on these.

Why our own parser rather than a package from PyPI (checked 2026-12): ``achkit`` (0.2.0) reads
every addenda record as one opaque ``info`` string, so it has no layout for returns (99, with
the dishonored and contested variants) or NOCs (98); it skips a record that comes out of order
instead of refusing the file, and its errors do not name the record. ``carta-ach`` (0.4.5,
2019) and ``ach`` (0.2, 2014) are unmaintained builders with a parser that keeps no record
numbers, validates no totals and knows no return or NOC addenda. A file refused whole, naming
the record and the reason, is the contract here; the format is fixed and small, so it is
written once, with the layouts as data.
"""
