"""The development stack's processes, as ``make bench`` and ``make chaos`` start them: the local
SQS server, a run's own PostgreSQL database, gunicorn and ``run_sqs_worker``. One place for the
commands, so both runs start what production runs, the same way."""
