"""The callback endpoint's error answers are bounded whatever the body holds."""

import json

import pytest

from tests.callbacks.test_endpoint import event_body, post, queued_messages


@pytest.mark.parametrize("value", ['"a\\u0000"', '"\\ud800"'])
def test_twenty_thousand_refused_fields_get_a_small_answer_that_counts_them(
    sqs_queues, module_settings, value
):
    # A host may allow larger bodies; the answer stays small whatever the limit.
    module_settings.CALLBACK_MAX_BODY_BYTES = 1024 * 1024
    text = json.dumps(event_body())
    raw = (text[:-1] + "".join(f', "f{i}": {value}' for i in range(20_000)) + "}").encode()

    response = post(raw)

    assert response.status_code == 400
    assert len(response.content) < 4096
    errors = response.json()["error"]["errors"]
    assert len(errors) <= 11
    assert errors["more_errors"] == ["and 19,990 more fields with errors, not shown"]
    assert queued_messages(sqs_queues) == []
