"""The pipeline against its simulated world (``tests.model``): a short run in the normal tier,
a few hundred and then thousands of sequences in the scale tier.

The normal tier runs 20 sequences from a seed of their own (``quick``, 10 to 15 s): the four
shards of 50 it ran before took 40 to 80 s each, a tenth of ``make test``'s test time, for
sequences the scale tier draws by the thousand anyway. The shards run in the scale tier, as
they were (200 sequences of 25 moves, each shard from its own seed: with ``database=None``
nothing is replayed from one run to another), beside its run of 1,400 sequences of 30 moves (it
ran 1,600: the 200 the shards brought to the scale tier are taken from it, so the tier runs as
many sequences, in about as long, as before). ``MODEL_EXAMPLES`` sets a run's count."""

import os
import random

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import get_state_machine_test

from tests.model.machine import PipelineModel

pytestmark = pytest.mark.django_db(transaction=True)

SHARDS = 4
EXAMPLES = 200  # over the scale tier's shards, 50 each
QUICK_EXAMPLES = 20  # make test's run
RUNS = [
    pytest.param(QUICK_EXAMPLES, id="quick"),
    *(
        pytest.param(EXAMPLES // SHARDS, id=f"shard{shard}", marks=pytest.mark.scale)
        for shard in range(SHARDS)
    ),
]


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


@pytest.mark.parametrize("examples", RUNS)
def test_the_pipeline_keeps_every_invariant_in_a_simulated_world(model_world, request, examples):
    run_model(examples=examples, steps=25, replay=request.node.nodeid)


@pytest.mark.scale
def test_the_pipeline_keeps_every_invariant_over_thousands_of_runs(model_world, request):
    run_model(examples=1400, steps=30, replay=request.node.nodeid)
