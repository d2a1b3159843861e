"""NACHA files sealed at rest: the clear ``content`` columns of outbound and inbound files become
the vault's sealed fields.

Existing rows are sealed by the vault's key holder as configured (``VAULT_KEY_PROVIDER``,
``VAULT_ACTIVE_KEY``), under a data key of each file's own, before the clear columns are dropped:
nothing is lost. A database holding files with no vault key configured is refused naming the
setting, before anything changes. Reversible: going back opens each row into its clear column
again (the key holder must still hold the keys).
"""

from django.core.exceptions import ImproperlyConfigured
from django.db import migrations, models

BATCH = 200


def _files(apps):
    return (
        (apps.get_model("payments", "NachaFile"), "outbound"),
        (apps.get_model("payments", "NachaInboundFile"), "inbound"),
    )


def _aad(kind, row):
    from bank.nacha.sealing import inbound_aad, outbound_aad

    if kind == "outbound":
        return outbound_aad(file_id=row.pk, sha256=row.sha256)
    return inbound_aad(sha256=row.sha256)


def _clear(kind, row):
    return row.content.encode("ascii") if kind == "outbound" else bytes(row.content)


def seal_contents(apps, schema_editor):
    from bank import conf
    from bank.nacha.sealing import content_seal

    files = _files(apps)
    if any(model.objects.exists() for model, _ in files) and not conf.VAULT_ACTIVE_KEY:
        raise ImproperlyConfigured(
            "NACHA files are stored in the clear and must be sealed by the vault: set "
            "BANK['VAULT_ACTIVE_KEY'] (and its key) before migrating"
        )
    for model, kind in files:
        for row in model.objects.order_by("pk").iterator(chunk_size=BATCH):
            fields = content_seal(_clear(kind, row), aad=_aad(kind, row))
            model.objects.filter(pk=row.pk).update(**fields)


def open_contents(apps, schema_editor):
    from bank.vault.crypto import Sealed, unseal

    for model, kind in _files(apps):
        for row in model.objects.order_by("pk").iterator(chunk_size=BATCH):
            content = unseal(Sealed.of(row), aad=_aad(kind, row))
            clear = content.decode("ascii") if kind == "outbound" else content
            model.objects.filter(pk=row.pk).update(content=clear)


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0019_nacha_file_delivery_conflict_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="nachafile",
            name="key_version",
            field=models.CharField(db_index=True, default="", max_length=32),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="nachafile",
            name="wrapped_key",
            field=models.BinaryField(default=b""),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="nachafile",
            name="nonce",
            field=models.BinaryField(default=b""),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="nachafile",
            name="ciphertext",
            field=models.BinaryField(default=b""),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="nachainboundfile",
            name="key_version",
            field=models.CharField(db_index=True, default="", max_length=32),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="nachainboundfile",
            name="wrapped_key",
            field=models.BinaryField(default=b""),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="nachainboundfile",
            name="nonce",
            field=models.BinaryField(default=b""),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="nachainboundfile",
            name="ciphertext",
            field=models.BinaryField(default=b""),
            preserve_default=False,
        ),
        # Nullable while they go, so that going back can add them again before they are
        # filled (and makes them required again once they are).
        migrations.AlterField(
            model_name="nachafile", name="content", field=models.TextField(null=True)
        ),
        migrations.AlterField(
            model_name="nachainboundfile", name="content", field=models.BinaryField(null=True)
        ),
        migrations.RunPython(seal_contents, open_contents, elidable=False),
        migrations.RemoveField(model_name="nachafile", name="content"),
        migrations.RemoveField(model_name="nachainboundfile", name="content"),
        migrations.AlterField(
            model_name="nachafile",
            name="sha256",
            field=models.CharField(help_text="Of the clear bytes, as cut", max_length=64),
        ),
        migrations.AlterField(
            model_name="nachainboundfile",
            name="sha256",
            field=models.CharField(help_text="Of the clear bytes", max_length=64, unique=True),
        ),
    ]
