"""The bank app takes over the bank path's models from the payments app (``payments.0029``),
table for table: the tables keep their names (``db_table``) and every row; only Django's state,
and the content types that permissions and the admin's log hang on, change app."""

import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MOVED = (
    "bankstatement",
    "booksvariance",
    "nachaentry",
    "nachafile",
    "nachainboundevent",
    "nachainboundfile",
    "nachatracecounter",
    "statementday",
    "statementline",
    "statementmatch",
    "varianceexplanation",
    "vaultaccount",
)


def content_types_follow(apps, schema_editor):
    """The moved models' content types change app, so their permissions (``explain_variance``,
    view and change), the groups and users holding them and the admin's log keep pointing at
    them. A content type already made for the bank app (a half-run upgrade) is left as is."""
    content_type = apps.get_model("contenttypes", "ContentType")
    taken = set(
        content_type.objects.filter(app_label="bank", model__in=MOVED).values_list(
            "model", flat=True
        )
    )
    content_type.objects.filter(app_label="payments", model__in=set(MOVED) - taken).update(
        app_label="bank"
    )


def content_types_return(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    content_type.objects.filter(app_label="bank", model__in=MOVED).update(app_label="payments")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("payments", "0029_bank_models_to_bank_app"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="BankStatement",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("key_version", models.CharField(db_index=True, max_length=32)),
                        ("wrapped_key", models.BinaryField()),
                        ("nonce", models.BinaryField()),
                        ("ciphertext", models.BinaryField()),
                        ("name", models.CharField(max_length=255)),
                        (
                            "sha256",
                            models.CharField(
                                help_text="Of the clear bytes", max_length=64, unique=True
                            ),
                        ),
                        ("refused_record", models.PositiveIntegerField(blank=True, null=True)),
                        ("refused_reason", models.TextField(blank=True)),
                        ("received_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("imported", "Imported: every line read"),
                                    ("refused", "Refused whole: malformed, nothing imported"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("line_count", models.PositiveIntegerField(default=0)),
                    ],
                    options={
                        "db_table": "payments_bankstatement",
                        "ordering": ["-received_at"],
                        "abstract": False,
                    },
                ),
                migrations.CreateModel(
                    name="NachaInboundFile",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("key_version", models.CharField(db_index=True, max_length=32)),
                        ("wrapped_key", models.BinaryField()),
                        ("nonce", models.BinaryField()),
                        ("ciphertext", models.BinaryField()),
                        ("name", models.CharField(max_length=255)),
                        (
                            "sha256",
                            models.CharField(
                                help_text="Of the clear bytes", max_length=64, unique=True
                            ),
                        ),
                        ("refused_record", models.PositiveIntegerField(blank=True, null=True)),
                        ("refused_reason", models.TextField(blank=True)),
                        ("received_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("imported", "Imported: every entry became an event"),
                                    ("refused", "Refused whole: malformed, nothing imported"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("entry_count", models.PositiveIntegerField(default=0)),
                    ],
                    options={
                        "db_table": "payments_nachainboundfile",
                        "ordering": ["-received_at"],
                        "abstract": False,
                    },
                ),
                migrations.CreateModel(
                    name="NachaTraceCounter",
                    fields=[
                        (
                            "odfi_identification",
                            models.CharField(max_length=8, primary_key=True, serialize=False),
                        ),
                        ("last_sequence", models.PositiveBigIntegerField(default=0)),
                    ],
                    options={
                        "db_table": "payments_nachatracecounter",
                    },
                ),
                migrations.CreateModel(
                    name="VaultAccount",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("token", models.CharField(max_length=64, unique=True)),
                        ("merchant_id", models.CharField(db_index=True, max_length=64)),
                        (
                            "account_type",
                            models.CharField(
                                choices=[("checking", "Checking"), ("savings", "Savings")],
                                max_length=8,
                            ),
                        ),
                        (
                            "sec_code",
                            models.CharField(
                                choices=[
                                    ("PPD", "PPD: consumer, written authorization"),
                                    ("CCD", "CCD: business account"),
                                    ("WEB", "WEB: consumer, authorized online"),
                                ],
                                max_length=3,
                            ),
                        ),
                        ("account_last4", models.CharField(max_length=4)),
                        ("key_version", models.CharField(db_index=True, max_length=32)),
                        ("wrapped_key", models.BinaryField()),
                        ("nonce", models.BinaryField()),
                        ("ciphertext", models.BinaryField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("rotated_at", models.DateTimeField(blank=True, null=True)),
                    ],
                    options={
                        "db_table": "payments_vaultaccount",
                        "ordering": ["-created_at"],
                    },
                ),
                migrations.CreateModel(
                    name="NachaFile",
                    fields=[
                        ("key_version", models.CharField(db_index=True, max_length=32)),
                        ("wrapped_key", models.BinaryField()),
                        ("nonce", models.BinaryField()),
                        ("ciphertext", models.BinaryField()),
                        (
                            "id",
                            models.UUIDField(
                                default=uuid.uuid4,
                                editable=False,
                                primary_key=True,
                                serialize=False,
                            ),
                        ),
                        ("window_name", models.CharField(max_length=64)),
                        ("bank_cutoff_at", models.DateTimeField()),
                        ("effective_entry_date", models.DateField()),
                        (
                            "creation_date",
                            models.DateField(
                                help_text="Eastern time, as the file header carries it"
                            ),
                        ),
                        ("file_id_modifier", models.CharField(max_length=1)),
                        ("name", models.CharField(max_length=128, unique=True)),
                        (
                            "sha256",
                            models.CharField(help_text="Of the clear bytes, as cut", max_length=64),
                        ),
                        ("entry_count", models.PositiveIntegerField()),
                        ("total_debit_cents", models.PositiveBigIntegerField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("delivered_at", models.DateTimeField(blank=True, null=True)),
                        ("delivered_to", models.CharField(blank=True, max_length=255)),
                        ("delivery_conflict_at", models.DateTimeField(blank=True, null=True)),
                    ],
                    options={
                        "db_table": "payments_nachafile",
                        "ordering": ["-created_at"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("creation_date", "file_id_modifier"),
                                name="nacha_file_modifier_per_day",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="StatementLine",
                    fields=[
                        (
                            "id",
                            models.UUIDField(
                                default=uuid.uuid4,
                                editable=False,
                                primary_key=True,
                                serialize=False,
                            ),
                        ),
                        ("record_number", models.PositiveIntegerField()),
                        ("account_last4", models.CharField(max_length=4)),
                        ("currency", models.CharField(max_length=3)),
                        ("as_of_date", models.DateField(db_index=True)),
                        ("type_code", models.CharField(max_length=3)),
                        ("direction", models.CharField(max_length=8)),
                        ("amount", models.DecimalField(decimal_places=2, max_digits=18)),
                        ("bank_reference", models.TextField(blank=True)),
                        ("customer_reference", models.TextField(blank=True)),
                        ("text", models.TextField(blank=True)),
                        ("fingerprint", models.CharField(max_length=64, unique=True)),
                        (
                            "match_status",
                            models.CharField(
                                choices=[
                                    ("matched", "Matched"),
                                    ("partial", "Partially matched"),
                                    ("unexplained", "Unexplained"),
                                ],
                                default="unexplained",
                                max_length=16,
                            ),
                        ),
                        (
                            "matched_amount",
                            models.DecimalField(decimal_places=2, default=0, max_digits=18),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                        (
                            "statement",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="lines",
                                to="bank.bankstatement",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "payments_statementline",
                        "ordering": ["as_of_date", "record_number"],
                    },
                ),
                migrations.CreateModel(
                    name="BooksVariance",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("key", models.CharField(max_length=200, unique=True)),
                        ("day", models.DateField(db_index=True)),
                        (
                            "kind",
                            models.CharField(
                                choices=[
                                    ("missing_settlement", "Batch sent, no settlement at the bank"),
                                    ("short_amount", "Bank settled another amount than the batch"),
                                    ("extra_line", "Bank line matching nothing of ours"),
                                    ("missing_return", "Return booked, not debited at the bank"),
                                ],
                                max_length=24,
                            ),
                        ),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("open", "Open: unexplained"),
                                    ("explained", "Explained by a person"),
                                    ("cleared", "Cleared by a later bank line"),
                                ],
                                default="open",
                                max_length=16,
                            ),
                        ),
                        ("currency", models.CharField(max_length=3)),
                        ("merchant_ids", models.JSONField(blank=True, default=list)),
                        (
                            "expected_amount",
                            models.DecimalField(decimal_places=2, default=0, max_digits=18),
                        ),
                        (
                            "bank_amount",
                            models.DecimalField(decimal_places=2, default=0, max_digits=18),
                        ),
                        ("sec_code", models.CharField(blank=True, max_length=3)),
                        ("summary", models.TextField()),
                        ("found_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                        ("cleared_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "payments",
                            models.ManyToManyField(
                                blank=True, related_name="+", to="payments.payment"
                            ),
                        ),
                        (
                            "nacha_file",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                to="bank.nachafile",
                            ),
                        ),
                        (
                            "cleared_by_line",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="bank.statementline",
                            ),
                        ),
                        (
                            "line",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="variances",
                                to="bank.statementline",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "payments_booksvariance",
                        "ordering": ["day", "found_at"],
                        "permissions": [("explain_variance", "Can explain a books variance")],
                    },
                ),
                migrations.CreateModel(
                    name="StatementMatch",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "kind",
                            models.CharField(
                                choices=[("batch", "ACH batch settlement"), ("return", "Return")],
                                max_length=16,
                            ),
                        ),
                        ("sec_code", models.CharField(blank=True, max_length=3)),
                        ("expected_amount", models.DecimalField(decimal_places=2, max_digits=18)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "line",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="matches",
                                to="bank.statementline",
                            ),
                        ),
                        (
                            "nacha_file",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                to="bank.nachafile",
                            ),
                        ),
                        (
                            "payment",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                to="payments.payment",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "payments_statementmatch",
                    },
                ),
                migrations.CreateModel(
                    name="VarianceExplanation",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("note", models.TextField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "explained_by",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "variance",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="explanations",
                                to="bank.booksvariance",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "payments_varianceexplanation",
                        "ordering": ["created_at"],
                    },
                ),
                migrations.CreateModel(
                    name="NachaEntry",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("trace_number", models.CharField(max_length=15, unique=True)),
                        ("sec_code", models.CharField(blank=True, max_length=3)),
                        ("refused_reason", models.CharField(blank=True, max_length=255)),
                        ("settled_event_at", models.DateTimeField(blank=True, null=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "payment",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="nacha_entry",
                                to="payments.payment",
                            ),
                        ),
                        (
                            "file",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="entries",
                                to="bank.nachafile",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "payments_nachaentry",
                        "indexes": [
                            models.Index(
                                condition=models.Q(("file__isnull", True), ("refused_reason", "")),
                                fields=["created_at"],
                                name="nacha_entry_not_in_a_file",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="NachaInboundEvent",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("record_number", models.PositiveIntegerField()),
                        ("original_trace_number", models.CharField(db_index=True, max_length=15)),
                        ("code", models.CharField(max_length=3)),
                        ("event_type", models.CharField(max_length=32)),
                        ("deduplication_id", models.CharField(max_length=128, unique=True)),
                        (
                            "event",
                            models.JSONField(
                                help_text="The processor event; never an account number"
                            ),
                        ),
                        ("published_at", models.DateTimeField(blank=True, null=True)),
                        ("message_id", models.CharField(blank=True, max_length=128)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "payment",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                to="payments.payment",
                            ),
                        ),
                        (
                            "file",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="events",
                                to="bank.nachainboundfile",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "payments_nachainboundevent",
                        "indexes": [
                            models.Index(
                                condition=models.Q(("published_at__isnull", True)),
                                fields=["id"],
                                name="nacha_inbound_unpublished",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="StatementDay",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("account_last4", models.CharField(max_length=4)),
                        ("currency", models.CharField(max_length=3)),
                        ("as_of_date", models.DateField(db_index=True)),
                        ("final", models.BooleanField(default=True)),
                        (
                            "statement",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="days",
                                to="bank.bankstatement",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "payments_statementday",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("statement", "account_last4", "currency", "as_of_date"),
                                name="books_statement_day_once",
                            )
                        ],
                    },
                ),
                migrations.AddIndex(
                    model_name="statementline",
                    index=models.Index(
                        condition=models.Q(("match_status", "matched"), _negated=True),
                        fields=["created_at"],
                        name="books_line_not_matched",
                    ),
                ),
                migrations.AddIndex(
                    model_name="booksvariance",
                    index=models.Index(
                        condition=models.Q(("status", "open")), fields=["day"], name="books_open"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="statementmatch",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("kind", "batch")),
                        fields=("nacha_file", "sec_code"),
                        name="books_batch_matched_once",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="statementmatch",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("kind", "return")),
                        fields=("payment",),
                        name="books_return_once",
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_follow, content_types_return),
    ]
