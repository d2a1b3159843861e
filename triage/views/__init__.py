"""Triage's admin pages beyond the admin's own: confirmations for one dead letter
(``dead_letters``) and for many (``bulk``), with what they share in ``common``. The dashboard is
an operations page: ``triage.operations.dashboard``."""
