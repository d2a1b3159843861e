"""A merchant's originator profile: written with its audit row in one transaction.

The admin's form calls ``originator_profile_save``; nothing else writes a profile, so every
change has its ``OriginatorProfileChange`` row naming who made it and each field before and
after.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from payments import originator
from payments.models import OriginatorProfile, OriginatorProfileChange

PROFILE_FIELDS = (
    "company_name",
    "company_identification",
    "allowed_sec_codes",
    "default_entry_description",
)


def originator_profile_problems(values: dict[str, Any]) -> dict[str, str]:
    """Each field of ``values`` the NACHA rules refuse, with why."""
    problems = {}
    if "company_name" in values and (
        problem := originator.text_problem(values["company_name"], originator.COMPANY_NAME_WIDTH)
    ):
        problems["company_name"] = problem
    if "company_identification" in values and (
        problem := originator.company_identification_problem(values["company_identification"])
    ):
        problems["company_identification"] = problem
    if "allowed_sec_codes" in values and (
        problem := originator.allowed_sec_codes_problem(values["allowed_sec_codes"])
    ):
        problems["allowed_sec_codes"] = problem
    description = values.get("default_entry_description")
    if description and (problem := originator.entry_description_problem(description)):
        problems["default_entry_description"] = problem
    return problems


def originator_profile_save(
    *, merchant_id: str, values: dict[str, Any], user=None
) -> OriginatorProfile:
    """Create or change ``merchant_id``'s profile with ``values`` (the fields of
    ``PROFILE_FIELDS`` it names) and record the change; ``ValidationError`` by field for a
    value the rules refuse, nothing written. A save that changes nothing writes no audit row.
    The profile's row is locked, so two admins' saves are recorded one after the other, each
    with the values it replaced."""
    unknown = sorted(set(values) - set(PROFILE_FIELDS))
    if unknown:
        raise ValidationError({name: "not a field of an originator profile" for name in unknown})
    if problems := originator_profile_problems(values):
        raise ValidationError(problems)
    try:
        with transaction.atomic():
            return _profile_save(merchant_id, values, user)
    except IntegrityError:
        # Another admin created it first: change that one, under its lock.
        with transaction.atomic():
            return _profile_save(merchant_id, values, user)


def _profile_save(merchant_id: str, values: dict[str, Any], user) -> OriginatorProfile:
    profile = OriginatorProfile.objects.select_for_update().filter(merchant_id=merchant_id).first()
    if profile is None:
        missing = [name for name in PROFILE_FIELDS[:3] if name not in values]
        if missing:
            raise ValidationError({name: "required for a new profile" for name in missing})
        profile = OriginatorProfile.objects.create(merchant_id=merchant_id, **values)
        changes = {name: [None, getattr(profile, name)] for name in values}
    else:
        changes = {
            name: [getattr(profile, name), value]
            for name, value in values.items()
            if getattr(profile, name) != value
        }
        if not changes:
            return profile
        for name, value in values.items():
            setattr(profile, name, value)
        profile.save(update_fields=[*changes, "updated_at"])
    OriginatorProfileChange.objects.create(
        profile=profile, merchant_id=merchant_id, user=user, changes=changes
    )
    return profile
