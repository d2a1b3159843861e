"""The pipeline against its simulated world (``tests.model``): a few hundred runs in the normal
tier, thousands in the scale tier."""

import os
import random

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import get_state_machine_test

from tests.model.machine import PipelineModel

pytestmark = pytest.mark.django_db(transaction=True)


def run_model(*, examples: int, steps: int) -> None:
    """Run ``examples`` sequences of up to ``steps`` moves from one seed (``MODEL_SEED`` or a
    fresh one, printed): a failure shrinks to a short sequence, printed with its blob."""
    chosen = int(os.environ.get("MODEL_SEED") or random.randrange(2**32))
    print(f"model seed {chosen}: replay with MODEL_SEED={chosen}")
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
        exc.add_note(f"model seed {chosen}: replay with MODEL_SEED={chosen}")
        raise
    finally:
        print("reached:", dict(sorted(PipelineModel.reached.items())))


def test_the_pipeline_keeps_every_invariant_in_a_simulated_world(model_world):
    run_model(examples=200, steps=25)


@pytest.mark.scale
def test_the_pipeline_keeps_every_invariant_over_thousands_of_runs(model_world):
    run_model(examples=1600, steps=30)
