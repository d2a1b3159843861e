"""A model test of the pipeline: the real code in a simulated world, driven by a seed.

As a simulation test does (FoundationDB's, TigerBeetle's VOPR), ``machine.PipelineModel`` runs
the product's own services, worker, handlers, dedup records, event log, ledger and triage on
the real PostgreSQL, against an in-process queue (``queue.SimSqs``: FIFO groups, visibility
timeouts, redelivery, several messages of a group per receive, the 5-minute deduplication
window, a crash between commit and delete), processor (``processor.SimProcessor``: charges,
timeouts after charging, 5xx, 4xx, 429, flapping, callbacks late, twice and out of order) and
clock (``clock.SimClock``, behind ``timezone.now``), and checks every invariant after every step.
Hypothesis chooses the steps and shrinks a failure to a short sequence.

Replaying a run: every run (the normal tier's ``quick``, each of the scale tier's shards) prints
``model seed N`` and its test's id; a failure adds both to its error, prints the shrunk steps as
Python (``state = PipelineModel()``, ``state.create(...)``, ...) and a ``@reproduce_failure(...)``
blob. Replay the seed with

    MODEL_SEED=N .venv/bin/python -m pytest \
        'tests/model/test_pipeline_model.py::test_the_pipeline_keeps_every_invariant_in_a_simulated_world[shard2]'

(``MODEL_EXAMPLES``, a run's count, and ``MODEL_STEPS`` must match the run's, when it set
them), or put the blob's decorator on ``PipelineModel`` to replay exactly the shrunk failure.
The normal tier runs 20 sequences; the scale tier (``-m scale``) 200 as four shards of 50, then
thousands, longer ones.
"""
