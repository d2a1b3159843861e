"""The bank path's models (NACHA files and entries, inbound files and events, the vault's
accounts, the books' statements and variances) leave the payments app for the bank app, which
takes them over in ``bank.0001`` with the same tables: state only, no table or row is touched.
A project without the bank app keeps the tables, unused."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0028_refund_hold"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name="statementline",
                    name="statement",
                ),
                migrations.RemoveField(
                    model_name="statementday",
                    name="statement",
                ),
                migrations.RemoveField(
                    model_name="booksvariance",
                    name="cleared_by_line",
                ),
                migrations.RemoveField(
                    model_name="booksvariance",
                    name="line",
                ),
                migrations.RemoveField(
                    model_name="booksvariance",
                    name="nacha_file",
                ),
                migrations.RemoveField(
                    model_name="booksvariance",
                    name="payments",
                ),
                migrations.RemoveField(
                    model_name="varianceexplanation",
                    name="variance",
                ),
                migrations.RemoveField(
                    model_name="nachaentry",
                    name="file",
                ),
                migrations.RemoveField(
                    model_name="nachaentry",
                    name="payment",
                ),
                migrations.RemoveField(
                    model_name="statementmatch",
                    name="nacha_file",
                ),
                migrations.RemoveField(
                    model_name="nachainboundevent",
                    name="file",
                ),
                migrations.RemoveField(
                    model_name="nachainboundevent",
                    name="payment",
                ),
                migrations.DeleteModel(
                    name="NachaTraceCounter",
                ),
                migrations.RemoveField(
                    model_name="statementmatch",
                    name="line",
                ),
                migrations.RemoveField(
                    model_name="statementmatch",
                    name="payment",
                ),
                migrations.RemoveField(
                    model_name="varianceexplanation",
                    name="explained_by",
                ),
                migrations.DeleteModel(
                    name="VaultAccount",
                ),
                migrations.DeleteModel(
                    name="BankStatement",
                ),
                migrations.DeleteModel(
                    name="StatementDay",
                ),
                migrations.DeleteModel(
                    name="BooksVariance",
                ),
                migrations.DeleteModel(
                    name="NachaEntry",
                ),
                migrations.DeleteModel(
                    name="NachaFile",
                ),
                migrations.DeleteModel(
                    name="NachaInboundFile",
                ),
                migrations.DeleteModel(
                    name="NachaInboundEvent",
                ),
                migrations.DeleteModel(
                    name="StatementLine",
                ),
                migrations.DeleteModel(
                    name="StatementMatch",
                ),
                migrations.DeleteModel(
                    name="VarianceExplanation",
                ),
            ],
            database_operations=[],
        ),
    ]
