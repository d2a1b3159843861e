"""Only the regular files of the bank's drop are read. A symbolic link (to a returns file
outside the drop), a named pipe, or a name swapped for a link after it was listed is never read
through: the entry itself is moved to ``refused/`` and raises one alert, not one per round.
Both transports, on a real directory and over a real OpenSSH server."""

import os
import shutil

import pytest

from bank.collect import nacha_files_collect
from bank.nacha.inbound import stray_entry_key
from bank.nacha.models import NachaInboundEvent, NachaInboundFile
from bank.nacha.sftp import SftpTransport
from bank.nacha.transports import DirectoryTransport, NotARegularFile
from payments.signals import alert_raised
from tests.bank.nacha.conftest import FILE_KEY, read_file
from tests.bank.nacha.sshd import sshd_start
from triage.models import Alert

# Triage stores an alert after the caller's commit: real transactions.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("vault_key")]

RETURNS = read_file("returns.ach")  # a good bank file: read, it would be imported


@pytest.fixture
def vault_key(module_settings):
    """Files read from the drop are stored sealed by the vault."""
    module_settings.VAULT_KEYS = {"k1": FILE_KEY}
    module_settings.VAULT_ACTIVE_KEY = "k1"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = sshd_start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def directory(tmp_path):
    transport = DirectoryTransport(outbound=str(tmp_path / "out"), inbound=str(tmp_path / "in"))
    os.makedirs(transport.inbound)
    return transport


@pytest.fixture
def sftp(request, tmp_path):
    server = request.getfixturevalue("sshd")
    (tmp_path / "in").mkdir()
    transport = SftpTransport(
        host="127.0.0.1",
        port=server.port,
        username=server.username,
        private_key_path=server.client_key_path,
        host_key=server.host_key,
        outbound=str(tmp_path / "out"),
        inbound=str(tmp_path / "in"),
        timeout_seconds=10,
    )
    yield transport
    transport.close()


KINDS = [
    pytest.param("directory", id="directory"),
    pytest.param("sftp", id="sftp", marks=pytest.mark.subprocess),
]


@pytest.fixture
def transport(request):
    return request.getfixturevalue(request.param)


@pytest.fixture
def raised():
    calls = []

    def receiver(sender, **kwargs):
        calls.append(kwargs)

    alert_raised.connect(receiver, dispatch_uid="test_nacha_inbound_strays")
    yield calls
    alert_raised.disconnect(dispatch_uid="test_nacha_inbound_strays")


@pytest.fixture
def outside(tmp_path):
    """A returns file outside the drop, which a link in the drop names."""
    path = tmp_path / "elsewhere" / "returns.ach"
    path.parent.mkdir()
    path.write_bytes(RETURNS)
    return path


def _nothing_imported() -> bool:
    return not NachaInboundFile.objects.exists() and not NachaInboundEvent.objects.exists()


@pytest.mark.parametrize("transport", KINDS, indirect=True)
def test_a_link_out_of_the_drop_is_set_aside_unread_with_one_alert_across_rounds(
    transport, outside, raised, sqs_queues
):
    inbound = str(transport.inbound)
    os.symlink(outside, os.path.join(inbound, "returns-0302.ach"))

    first = nacha_files_collect(transport=transport, min_age_seconds=0)
    second = nacha_files_collect(transport=transport, min_age_seconds=0)

    assert _nothing_imported()
    assert first.set_aside == ["returns-0302.ach"] and first.imported == []
    assert second.set_aside == [] and second.imported == []
    key = stray_entry_key("returns-0302.ach")
    assert [(r["key"], r["severity"]) for r in raised] == [(key, "high")]
    alert = Alert.objects.get(key=key)
    assert "returns-0302.ach in the bank's drop is a symbolic link" in alert.summary
    assert alert.details["kind"] == "symbolic link"
    # The link itself was moved, its target left as it was.
    moved = os.path.join(inbound, "refused", "returns-0302.ach")
    assert os.path.islink(moved) and os.readlink(moved) == str(outside)
    assert sorted(os.listdir(inbound)) == ["refused"]
    assert outside.read_bytes() == RETURNS
    # Nothing reached the queue or its dead-letter queue.
    for url in (sqs_queues.url, sqs_queues.dlq_url):
        attributes = sqs_queues.client.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        assert attributes["ApproximateNumberOfMessages"] == "0"


@pytest.mark.parametrize("transport", KINDS, indirect=True)
def test_a_link_to_a_file_in_the_drop_is_refused_too(transport, raised):
    # Not only links out of the drop: no link at all is read.
    inbound = str(transport.inbound)
    os.makedirs(os.path.join(inbound, "processed"))
    with open(os.path.join(inbound, "processed", "old.ach"), "wb") as handle:
        handle.write(RETURNS)
    os.symlink("processed/old.ach", os.path.join(inbound, "again.ach"))

    result = nacha_files_collect(transport=transport, min_age_seconds=0)

    assert result.set_aside == ["again.ach"] and _nothing_imported()
    assert [r["key"] for r in raised] == [stray_entry_key("again.ach")]


@pytest.mark.parametrize("transport", KINDS, indirect=True)
def test_a_named_pipe_in_the_drop_is_set_aside_never_opened(transport, raised):
    inbound = str(transport.inbound)
    os.mkfifo(os.path.join(inbound, "returns.ach"))  # opened, it would block the reader

    result = nacha_files_collect(transport=transport, min_age_seconds=0)

    assert result.set_aside == ["returns.ach"] and _nothing_imported()
    assert [r["details"]["kind"] for r in raised] == ["named pipe"]


@pytest.mark.parametrize("transport", KINDS, indirect=True)
def test_a_name_swapped_for_a_link_after_the_listing_is_refused_at_the_read(
    transport, outside, raised, sqs_queues
):
    inbound = str(transport.inbound)
    path = os.path.join(inbound, "returns.ach")
    with open(path, "wb") as handle:
        handle.write(b"a regular file when listed")
    listed = transport.incoming

    def listed_then_swapped(**kwargs):
        names = listed(**kwargs)
        os.unlink(path)
        os.symlink(outside, path)
        return names

    transport.incoming = listed_then_swapped

    result = nacha_files_collect(transport=transport, min_age_seconds=0)

    assert result.set_aside == ["returns.ach"] and result.imported == []
    assert _nothing_imported()
    assert [r["key"] for r in raised] == [stray_entry_key("returns.ach")]
    assert os.path.islink(os.path.join(inbound, "refused", "returns.ach"))


def test_a_link_swapped_in_between_the_check_and_the_opening_is_not_followed(
    directory, outside, monkeypatch
):
    # The window inside ``read`` itself: the name is regular when checked, a link when opened.
    path = directory.inbound / "returns.ach"
    path.write_bytes(b"a regular file when checked")
    lstat = os.lstat
    swapped = []

    def checked_then_swapped(target, *args, **kwargs):
        status = lstat(target, *args, **kwargs)
        if str(target) == str(path) and not swapped:
            swapped.append(target)
            path.unlink()
            path.symlink_to(outside)
        return status

    monkeypatch.setattr(os, "lstat", checked_then_swapped)
    with pytest.raises(NotARegularFile, match="is a symbolic link"):
        directory.read("returns.ach")
    assert swapped and os.path.islink(path)


@pytest.mark.subprocess
def test_over_sftp_a_link_swapped_in_between_the_check_and_the_opening_is_not_read(
    sftp, outside, monkeypatch
):
    # SFTP cannot open without following: the opened handle and a second lstat catch the swap.
    path = os.path.join(sftp.inbound, "returns.ach")
    with open(path, "wb") as handle:
        handle.write(b"a regular file when checked")
    import paramiko

    lstat = paramiko.SFTPClient.lstat
    swapped = []

    def checked_then_swapped(client, target):
        attributes = lstat(client, target)
        if not swapped:
            swapped.append(target)
            os.unlink(path)
            os.symlink(outside, path)
        return attributes

    monkeypatch.setattr(paramiko.SFTPClient, "lstat", checked_then_swapped)
    with pytest.raises(NotARegularFile, match="is a symbolic link"):
        sftp.read("returns.ach")
    assert swapped == [path]


@pytest.mark.parametrize("transport", KINDS, indirect=True)
def test_regular_files_beside_a_link_are_still_imported(transport, outside, raised, sqs_queues):
    inbound = str(transport.inbound)
    shutil.copy(outside, os.path.join(inbound, "returns-0301.ach"))
    os.symlink(outside, os.path.join(inbound, "returns-0302.ach"))

    result = nacha_files_collect(transport=transport, min_age_seconds=0)

    assert result.imported == ["returns-0301.ach"] and result.set_aside == ["returns-0302.ach"]
    assert list(NachaInboundFile.objects.values_list("name", flat=True)) == ["returns-0301.ach"]
    assert [r["key"] for r in raised] == [stray_entry_key("returns-0302.ach")]


@pytest.mark.parametrize("transport", KINDS, indirect=True)
def test_a_link_named_refused_never_carries_an_entry_out_of_the_drop(
    transport, outside, raised, tmp_path
):
    inbound = str(transport.inbound)
    elsewhere = tmp_path / "elsewhere-dir"
    elsewhere.mkdir()
    os.symlink(elsewhere, os.path.join(inbound, "refused"))
    os.symlink(outside, os.path.join(inbound, "returns.ach"))

    result = nacha_files_collect(transport=transport, min_age_seconds=0)

    assert result.set_aside == ["refused", "returns.ach"] and _nothing_imported()
    assert os.listdir(elsewhere) == []  # nothing moved through the link
    assert os.path.islink(os.path.join(inbound, "returns.ach"))  # left where it was, unread
    assert [r["details"]["set_aside_to"] for r in raised] == ["", ""]
    assert all("could not be moved aside" in r["summary"] for r in raised)
