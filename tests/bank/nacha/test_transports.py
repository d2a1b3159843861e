"""Transports: a file reaches the bank whole or not at all, and never twice; collection skips
what is still being written. The SFTP transport runs against a real OpenSSH server."""

import os
import threading
import time
from datetime import datetime

import pytest

from bank.nacha.models import NachaFile
from bank.nacha.services import nacha_entry_add, nacha_file_cut, nacha_file_deliver
from bank.nacha.sftp import SftpTransport
from bank.nacha.transports import (
    DeliveryConflict,
    DirectoryTransport,
    TransportError,
    parse_transport,
    transport_open,
)
from bank.nacha.windows import EASTERN
from tests.bank.nacha.sshd import sshd_start
from tests.bank.nacha.test_file_cut import resolve
from tests.factories import PaymentFactory

CONTENT = b"101 021000021...\n" * 3


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = sshd_start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def sftp_dirs(sshd, tmp_path):
    outbound, inbound = tmp_path / "to-bank", tmp_path / "from-bank"
    outbound.mkdir()
    inbound.mkdir()
    return outbound, inbound


@pytest.fixture
def sftp(sshd, sftp_dirs):
    outbound, inbound = sftp_dirs
    transport = SftpTransport(
        host="127.0.0.1",
        port=sshd.port,
        username=sshd.username,
        private_key_path=sshd.client_key_path,
        host_key=sshd.host_key,
        outbound=str(outbound),
        inbound=str(inbound),
        timeout_seconds=10,
    )
    yield transport
    transport.close()


@pytest.fixture
def directory(tmp_path):
    return DirectoryTransport(outbound=str(tmp_path / "out"), inbound=str(tmp_path / "in"))


# The same behaviours for both transports: ``kind`` picks the fixture.
KINDS = [
    pytest.param("directory", id="directory"),
    pytest.param("sftp", id="sftp", marks=pytest.mark.subprocess),
]


@pytest.fixture
def transport(request, tmp_path):
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("transport", KINDS, indirect=True)
def test_a_delivered_file_is_whole_under_its_name_and_nothing_else_is_left(transport):
    location = transport.deliver("20261201-A-next_day.ach", CONTENT)
    outbound = os.path.dirname(location)
    assert os.listdir(outbound) == ["20261201-A-next_day.ach"]
    with open(location, "rb") as handle:
        assert handle.read() == CONTENT


@pytest.mark.parametrize("transport", KINDS, indirect=True)
def test_delivering_the_same_bytes_again_sends_nothing_new(transport):
    first = transport.deliver("f.ach", CONTENT)
    mtime = os.stat(first).st_mtime_ns
    time.sleep(0.01)
    assert transport.deliver("f.ach", CONTENT) == first
    assert os.stat(first).st_mtime_ns == mtime
    assert os.listdir(os.path.dirname(first)) == ["f.ach"]


@pytest.mark.parametrize("transport", KINDS, indirect=True)
def test_other_bytes_under_a_delivered_name_are_a_conflict_never_an_overwrite(transport):
    first = transport.deliver("f.ach", CONTENT)
    with pytest.raises(DeliveryConflict, match="f.ach is already delivered with other bytes"):
        transport.deliver("f.ach", CONTENT + b"x")
    with open(first, "rb") as handle:
        assert handle.read() == CONTENT


def test_collection_skips_temporary_hidden_and_still_changing_files(directory):
    # The directory's files are stamped by this machine's clock; SFTP's own rule is below.
    transport = directory
    inbound = transport.inbound
    os.makedirs(inbound, exist_ok=True)
    old = time.time() - 3600
    for name in ("returns-1.ach", ".hidden.ach", ".r.ach.1234.partial", "fresh.ach"):
        with open(os.path.join(inbound, name), "wb") as handle:
            handle.write(b"x")
        if name != "fresh.ach":
            os.utime(os.path.join(inbound, name), (old, old))
    assert transport.incoming(min_age_seconds=60) == ["returns-1.ach"]
    assert transport.incoming(min_age_seconds=0) == ["fresh.ach", "returns-1.ach"]
    assert transport.read("returns-1.ach") == b"x"
    transport.collected("returns-1.ach")
    assert transport.incoming(min_age_seconds=60) == []
    assert os.listdir(os.path.join(inbound, "processed")) == ["returns-1.ach"]


@pytest.mark.parametrize("transport", KINDS, indirect=True)
def test_a_name_that_is_not_one_path_segment_is_refused(transport):
    for name in ("../etc/passwd", "a/b.ach", ".hidden", ""):
        with pytest.raises(ValueError, match="one path segment"):
            transport.deliver(name, CONTENT)


def test_a_crash_after_the_write_leaves_no_file_under_the_real_name(directory, monkeypatch):
    def crash(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "link", crash)
    with pytest.raises(TransportError, match="No space left"):
        directory.deliver("f.ach", CONTENT)
    assert os.listdir(directory.outbound) == []


@pytest.mark.subprocess
def test_sftp_refuses_a_server_whose_host_key_is_not_the_pinned_one(sshd, sftp_dirs, tmp_path):
    other = sshd_host_key_other(tmp_path)
    transport = SftpTransport(
        host="127.0.0.1",
        port=sshd.port,
        username=sshd.username,
        private_key_path=sshd.client_key_path,
        host_key=other,
        outbound=str(sftp_dirs[0]),
        inbound=str(sftp_dirs[1]),
        timeout_seconds=10,
    )
    with pytest.raises(TransportError, match="cannot reach"):
        transport.deliver("f.ach", CONTENT)
    assert os.listdir(sftp_dirs[0]) == []


@pytest.mark.subprocess
def test_sftp_to_a_closed_port_is_a_retryable_transport_error(sshd, sftp_dirs):
    transport = SftpTransport(
        host="127.0.0.1",
        port=9,
        username=sshd.username,
        private_key_path=sshd.client_key_path,
        host_key=sshd.host_key,
        outbound=str(sftp_dirs[0]),
        inbound=str(sftp_dirs[1]),
        timeout_seconds=5,
    )
    with pytest.raises(TransportError):
        transport.deliver("f.ach", CONTENT)


def sshd_host_key_other(tmp_path) -> str:
    import subprocess

    path = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join((tmp_path / "other.pub").read_text().split()[:2])


@pytest.mark.django_db
@pytest.mark.parametrize("transport", KINDS, indirect=True)
def test_a_cut_file_is_delivered_once_and_recorded(transport, nacha_settings):
    nacha_entry_add(payment_id=PaymentFactory().pk)
    cut = nacha_file_cut(
        now=datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN), resolve_account=resolve
    ).file
    delivered = nacha_file_deliver(file_id=cut.pk, transport=transport)
    assert delivered.delivered_at is not None
    assert delivered.delivered_to.endswith(cut.name)
    with open(delivered.delivered_to, "rb") as handle:
        assert handle.read() == cut.content_bytes()
    # A retry after our record: nothing is sent.
    calls = []
    original = transport.deliver
    transport.deliver = lambda *a: calls.append(a) or original(*a)
    again = nacha_file_deliver(file_id=cut.pk, transport=transport)
    assert calls == [] and again.delivered_at == delivered.delivered_at


@pytest.mark.django_db
def test_a_retry_after_a_crash_before_the_record_finds_the_file_and_only_records_it(
    directory, nacha_settings
):
    nacha_entry_add(payment_id=PaymentFactory().pk)
    cut = nacha_file_cut(
        now=datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN), resolve_account=resolve
    ).file
    directory.deliver(cut.name, cut.content_bytes())  # the crash came right after this
    assert NachaFile.objects.get(pk=cut.pk).delivered_at is None
    delivered = nacha_file_deliver(file_id=cut.pk, transport=directory)
    assert delivered.delivered_at is not None
    assert os.listdir(directory.outbound) == [cut.name]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"kind": "ftp"}, "kind is 'directory' or 'sftp'"),
        ({"kind": "directory", "outbound": "/x"}, "missing key(s) ['inbound']"),
        ({"kind": "directory", "outbound": "/x", "inbound": "/y", "host": "h"}, "unknown key"),
        (
            {
                "kind": "sftp",
                "host": "h",
                "username": "u",
                "private_key_path": "/k",
                "host_key": "ssh-ed25519 AAAA",
                "outbound": "/o",
                "inbound": "/i",
                "port": 0,
            },
            "port",
        ),
        ({"kind": "directory", "outbound": "", "inbound": "/y"}, "non-empty"),
    ],
    ids=["kind", "missing", "unknown", "port", "empty"],
)
def test_a_wrong_transport_setting_is_refused_naming_the_key(value, problem):
    with pytest.raises(ValueError) as caught:
        parse_transport(value)
    assert problem in str(caught.value)


def test_the_configured_transport_is_opened_from_the_setting(module_settings, tmp_path):
    module_settings.NACHA_TRANSPORT = {
        "kind": "directory",
        "outbound": str(tmp_path / "o"),
        "inbound": str(tmp_path / "i"),
    }
    opened = transport_open()
    assert isinstance(opened, DirectoryTransport) and str(opened.outbound) == str(tmp_path / "o")


# --- SFTP: whole files whatever the server's clock says ---------------------------------------

DAY = 24 * 3600


def _put(inbound, name: str, content: bytes, mtime: float) -> str:
    path = os.path.join(inbound, name)
    with open(path, "wb") as handle:
        handle.write(content)
    os.utime(path, (mtime, mtime))
    return path


@pytest.mark.subprocess
def test_sftp_takes_a_settled_file_whose_mtime_is_a_day_ahead_of_our_clock(sftp):
    # A server clock a day fast: by mtime against our clock the file would wait a day.
    _put(sftp.inbound, "ahead.ach", b"returns", time.time() + DAY)
    assert sftp.incoming(min_age_seconds=0.5) == ["ahead.ach"]


@pytest.mark.subprocess
def test_sftp_takes_a_file_whose_mtime_was_set_ahead_over_sftp(sftp):
    path = _put(sftp.inbound, "ahead.ach", b"returns", time.time())
    future = int(time.time() + 3 * DAY)
    sftp._call(lambda c: c.utime(path, (future, future)))
    assert os.stat(path).st_mtime == future
    assert sftp.incoming(min_age_seconds=0.5) == ["ahead.ach"]


@pytest.mark.subprocess
def test_sftp_leaves_a_growing_file_whose_mtime_is_a_day_behind(sftp):
    # A server clock a day slow: by mtime the file looks old while the bank still writes it.
    behind = time.time() - DAY
    path = _put(sftp.inbound, "growing.ach", b"101 part one", behind)
    _put(sftp.inbound, "whole.ach", b"returns", behind)

    def keep_writing():
        time.sleep(0.3)
        with open(path, "ab") as handle:
            handle.write(b" and part two")
        os.utime(path, (behind + 1, behind + 1))

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        assert sftp.incoming(min_age_seconds=1.0) == ["whole.ach"]
    finally:
        writer.join()
    # Written out: the next round takes it.
    assert sftp.incoming(min_age_seconds=0.5) == ["growing.ach", "whole.ach"]


@pytest.mark.subprocess
def test_sftp_leaves_a_file_rewritten_in_place_at_the_same_size(sftp):
    behind = time.time() - DAY
    path = _put(sftp.inbound, "rewritten.ach", b"AAAA", behind)

    done = threading.Event()

    def rewrite():
        # Rewritten again and again while the round watches (same size, an older mtime each
        # time), so its two looks see two versions however long its connection takes to open.
        for step in range(1, 600):
            if done.wait(0.1):
                return
            _put(sftp.inbound, "rewritten.ach", (b"BBBB", b"CCCC")[step % 2], behind - 60 * step)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        assert sftp.incoming(min_age_seconds=1.0) == []
    finally:
        done.set()
        writer.join()
    assert os.path.getsize(path) == 4
    assert sftp.incoming(min_age_seconds=0.5) == ["rewritten.ach"]


@pytest.mark.subprocess
def test_sftp_collection_skips_temporary_hidden_and_other_entries(sftp):
    old = time.time() - DAY
    for name in ("returns-1.ach", ".hidden.ach", ".r.ach.1234.partial"):
        _put(sftp.inbound, name, b"x", old)
    os.mkdir(os.path.join(sftp.inbound, "a-directory.ach"))
    os.symlink("/etc/passwd", os.path.join(sftp.inbound, "link.ach"))
    assert sftp.incoming(min_age_seconds=0.2) == ["returns-1.ach"]
    assert sftp.incoming(min_age_seconds=0) == ["returns-1.ach"]
    sftp.collected("returns-1.ach")
    assert sftp.incoming(min_age_seconds=0.2) == []


@pytest.mark.subprocess
def test_sftp_with_an_empty_drop_does_not_wait(sftp):
    started = time.monotonic()
    assert sftp.incoming(min_age_seconds=30) == []
    assert time.monotonic() - started < 5
