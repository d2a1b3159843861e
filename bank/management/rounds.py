"""The bank path's rounds: a ``RoundsCommand`` (``payments.management.rounds``) that collects
the whole files of one of the bank's drops."""

from django.core.management.base import CommandError

from payments.management.rounds import RoundsCommand, seconds


class DropCollectCommand(RoundsCommand):
    """A round that reads the whole files in one of the bank's drops (``nacha_collect``'s return
    and NOC files, ``bank_statements_collect``'s statements): ``collect(transport,
    min_age_seconds)`` does the work; a transport or key holder that fails stops the round with
    ``what`` named, and the next round does it (nothing was stored for what could not be sealed
    or opened). ``report(result, options)`` writes what came."""

    what = "collection"

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument(
            "--min-age-seconds",
            type=seconds,
            default=60.0,
            help="skip files changed more recently (the bank may still be writing), 0-86400; "
            "default 60",
        )

    def transport_open(self):
        from bank.nacha.transports import transport_open

        return transport_open()

    def collect(self, *, transport, min_age_seconds: float):
        raise NotImplementedError

    def report(self, result, options) -> None:
        raise NotImplementedError

    def round(self, options) -> None:
        from bank.nacha.transports import TransportError
        from bank.vault.crypto import VaultUnavailable

        transport = self.transport_open()
        try:
            result = self.collect(transport=transport, min_age_seconds=options["min_age_seconds"])
        except TransportError as exc:
            raise CommandError(f"{self.what} stopped: {exc}") from exc
        except VaultUnavailable as exc:
            raise CommandError(f"{self.what} stopped, vault unavailable: {exc}") from exc
        finally:
            transport.close()
        self.report(result, options)
