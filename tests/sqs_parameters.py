"""The check botocore skips in production: every call made through ``callbacks.sqs`` is checked
against SQS's service model, as botocore would check it with ``parameter_validation`` on.

The gateway turns validation off (its parameters are built by its own code, and the check cost
CPU on every call); these tests are where its parameters are held to the model instead.
"""

import weakref

from botocore.validate import ParamValidator

from callbacks import sqs


class SqsParameterCheck:
    """Checks the parameters of every call made through ``sqs.sqs_client()`` while installed,
    and keeps what the model refused in ``invalid`` (the call itself goes on, as in production,
    so a test sees what production would do)."""

    def __init__(self, monkeypatch) -> None:
        self.invalid: list[str] = []
        self.checked = 0
        self._validator = ParamValidator()
        # A WeakSet, not ids: a client dropped by ``sqs.reset()`` can free its id for the next.
        self._clients: weakref.WeakSet = weakref.WeakSet()
        original = sqs.sqs_client

        def checked_client():
            client = original()
            if client not in self._clients:
                client.meta.events.register("before-parameter-build.sqs", self._check)
                self._clients.add(client)
            return client

        monkeypatch.setattr(sqs, "sqs_client", checked_client)

    def _check(self, params, model, **kwargs) -> None:
        self.checked += 1
        report = self._validator.validate(params, model.input_shape)
        if report.has_errors():
            self.invalid.append(f"{model.name}: {report.generate_report()}")
