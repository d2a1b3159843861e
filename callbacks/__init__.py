"""The queue layer: the callback endpoint and its contract, the one gateway to SQS, the outbox
relay, the FIFO worker (``run_sqs_worker``) and its message kinds, holds and parked messages,
reconciliation with the processor, and the bank's return and NOC files onto the queue."""
