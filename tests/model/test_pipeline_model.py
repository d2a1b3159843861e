"""The pipeline against its simulated world (``tests.model``): a few hundred runs in the normal
tier, thousands in the scale tier.

The normal tier's 200 sequences are four shards of 50, each from its own seed: one run of 200 took
150 to 320 s in one process while the others ran out of work; as shards, the processes of
``pytest -n`` share it. The same number of sequences, each drawn from its shard's seed (with
``database=None`` nothing is replayed from one run to another); ``MODEL_EXAMPLES`` sets a
shard's count."""

import os
import random

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import get_state_machine_test

from tests.model.machine import PipelineModel

pytestmark = pytest.mark.django_db(transaction=True)

SHARDS = 4
EXAMPLES = 200  # over the shards, 50 each


def run_model(*, examples: int, steps: int, replay: str) -> None:
    """Run ``examples`` sequences of up to ``steps`` moves from one seed (``MODEL_SEED`` or a
    fresh one, printed): a failure shrinks to a short sequence, printed with its blob. ``replay``
    names the test to rerun with the seed (one shard of several)."""
    chosen = int(os.environ.get("MODEL_SEED") or random.randrange(2**32))
    note = f"model seed {chosen}: replay with MODEL_SEED={chosen} pytest '{replay}'"
    print(note)
    test = get_state_machine_test(
        PipelineModel,
        settings=settings(
            max_examples=int(os.environ.get("MODEL_EXAMPLES") or examples),
            stateful_step_count=int(os.environ.get("MODEL_STEPS") or steps),
            deadline=None,
            database=None,
            print_blob=True,
            suppress_health_check=list(HealthCheck),
        ),
    )
    PipelineModel.reached.clear()
    try:
        seed(chosen)(test)()
    except BaseException as exc:
        exc.add_note(note)
        raise
    finally:
        print("reached:", dict(sorted(PipelineModel.reached.items())))


@pytest.mark.parametrize("shard", range(SHARDS), ids=lambda shard: f"shard{shard}")
def test_the_pipeline_keeps_every_invariant_in_a_simulated_world(model_world, request, shard):
    run_model(examples=EXAMPLES // SHARDS, steps=25, replay=request.node.nodeid)


@pytest.mark.scale
def test_the_pipeline_keeps_every_invariant_over_thousands_of_runs(model_world, request):
    run_model(examples=1600, steps=30, replay=request.node.nodeid)
