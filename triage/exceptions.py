"""Errors of the triage actions; each message tells the operator what to do next."""


class TriageError(Exception):
    """Base class: the action was refused or could not be completed."""


class NoteRequired(TriageError):
    def __init__(self) -> None:
        super().__init__(
            "A note is required: say why you are taking this action (ticket, finding, decision)."
        )


class DeadLetterNotOpen(TriageError):
    def __init__(self, dead_letter, action: str, detail: str = "") -> None:
        self.dead_letter = dead_letter
        super().__init__(
            detail
            or (
                f"Dead letter {dead_letter.pk} is {dead_letter.status}, not open: it cannot be "
                f"{action}. Only open dead letters can be redriven, resolved or discarded."
            )
        )


class NotAllowed(TriageError):
    def __init__(self, user) -> None:
        super().__init__(
            f"User {user} lacks the permission triage.act_on_deadletter: viewing is allowed, "
            "acting is not."
        )


class RedrivePublishFailed(TriageError):
    """The queue refused the redrive; nothing changed and the dead letter is still open."""


class HoldReleaseFailed(TriageError):
    """The payment's hold could not be released now; its parked messages stay parked."""


class BulkSelectionChanged(TriageError):
    """The filter's open dead letters changed between the confirmation page and the confirm."""

    def __init__(self, *, expected: int, found: int) -> None:
        self.expected = expected
        self.found = found
        super().__init__(
            f"The selection changed since the page was shown: {expected} open dead letter(s) "
            f"were confirmed, {found} match now (someone acted on some of them). Nothing was "
            "started: check the new count and confirm again."
        )


class BulkJobNotRunnable(TriageError):
    def __init__(self, job) -> None:
        self.job = job
        super().__init__(f"Bulk job {job.pk} is {job.status}: it can no longer be changed.")
