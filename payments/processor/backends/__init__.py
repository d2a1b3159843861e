"""The processor backends the module ships, one module each: ``http`` (``ProcessorClient``, the
default: the processor API of the design, which the sandbox serves) and ``example``
(``OtherProcessorBackend``: a processor of another shape, to copy when writing your own). A
host's own backend lives in its project and is named by ``PAYMENTS["PROCESSOR_BACKEND"]``."""
