"""installer.net.transfer.stream: the body to a consumer thread through a pipe, against a
real HTTPS server on 127.0.0.1 (the fixtures of test_transfer.py)."""

from __future__ import annotations

import os
import threading

import pytest
from werkzeug import Response

from installer.base.errors import DownloadError, IntegrityError
from installer.net.transfer import Cancelled, stream
from tests.unit.net.kit import FAST, PAYLOAD, PAYLOAD_SHA, ranged, seen
from tests.unit.net.test_transfer import dropping


class Consumer:
    """Reads its whole input (what an extractor does); counts its runs and discards."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.runs, self.discards, self.fail_after = 0, 0, fail_after
        self.thread_names: list[str] = []

    def __call__(self, body) -> bytes:
        self.runs += 1
        self.thread_names.append(threading.current_thread().name)
        if self.fail_after is not None:
            body.read(self.fail_after)
            raise IntegrityError("unsafe member")
        return body.read()

    def discard(self) -> None:
        self.discards += 1


def run(url, consumer, tmp_path, session=None, **kw):
    return stream(session, url, consumer, dest=tmp_path / "out", discard=consumer.discard,
                  policy=FAST, **kw)


def test_the_consumer_gets_the_body_in_a_worker_thread_digest_checked(server, session, tmp_path):
    server.expect_request("/f").respond_with_handler(ranged)
    consumer = Consumer()
    got, body = run(server.url_for("/f"), consumer, tmp_path, session,
                    expected_sha256=PAYLOAD_SHA)
    assert body == PAYLOAD and got.sha256 == PAYLOAD_SHA and got.size == len(PAYLOAD)
    assert consumer.thread_names == ["download-consumer"] and consumer.discards == 0


def drop_once(at: int, then):
    """The first request's body stops after ``at`` bytes; ``then`` answers the rest."""
    dropped = []

    def handler(request):
        if not dropped:
            dropped.append(at)
            return dropping(PAYLOAD, at)
        return then(request)

    return handler


def test_a_resume_is_invisible_to_the_consumer(server, session, tmp_path):
    server.expect_request("/f").respond_with_handler(drop_once(123_457, ranged))
    consumer = Consumer()
    got, body = run(server.url_for("/f"), consumer, tmp_path, session,
                    expected_sha256=PAYLOAD_SHA)
    assert body == PAYLOAD and got.resumed_bytes == 123_457
    assert (consumer.runs, consumer.discards) == (1, 0)
    assert [r.headers.get("Range") for r in seen(server)] == [None, "bytes=123457-"]


def test_a_restart_from_zero_discards_and_restarts_the_consumer(server, session, tmp_path):
    # The second answer is a 200 with the whole body: the server ignored the Range.
    server.expect_request("/f").respond_with_handler(drop_once(100_000, lambda _r: Response(PAYLOAD)))
    consumer = Consumer()
    _got, body = run(server.url_for("/f"), consumer, tmp_path, session,
                     expected_sha256=PAYLOAD_SHA)
    assert body == PAYLOAD and (consumer.runs, consumer.discards) == (2, 1)


def test_a_digest_mismatch_discards_what_the_consumer_wrote(server, session, tmp_path):
    server.expect_request("/f").respond_with_handler(ranged)
    consumer = Consumer()
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        run(server.url_for("/f"), consumer, tmp_path, session, expected_sha256="0" * 64)
    assert (consumer.runs, consumer.discards) == (1, 1)


def test_a_consumer_error_surfaces_as_itself_and_stops_the_download(server, session, tmp_path):
    total = 256 << 20  # far more than the pipe and the sockets' buffers hold
    sent = []

    def handler(_request):
        def body():
            for _ in range(total // (1 << 20)):
                sent.append(1 << 20)
                yield bytes(1 << 20)

        return Response(body(), headers={"Content-Length": str(total)},
                        direct_passthrough=True)

    server.expect_request("/big").respond_with_handler(handler)
    consumer = Consumer(fail_after=1000)
    with pytest.raises(IntegrityError, match="unsafe member"):
        run(server.url_for("/big"), consumer, tmp_path, session)
    assert (consumer.runs, consumer.discards) == (1, 1)
    assert sum(sent) < total // 2  # stopped, not downloaded to the end


def test_a_file_url_streams_the_same_way(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(PAYLOAD)
    consumer = Consumer()
    got, body = run(src.as_uri(), consumer, tmp_path, expected_sha256=PAYLOAD_SHA)
    assert body == PAYLOAD and got.size == len(PAYLOAD)
    with pytest.raises(DownloadError) as err:
        run((tmp_path / "missing").as_uri(), Consumer(), tmp_path)
    assert err.value.context["status"] == 404


def test_cancel_stops_and_discards(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(PAYLOAD)
    cancel = threading.Event()
    cancel.set()
    consumer = Consumer()
    with pytest.raises(Cancelled):
        run(src.as_uri(), consumer, tmp_path, cancel=cancel)
    assert consumer.discards == 1


def test_a_signal_mid_body_discards_and_leaves_no_consumer_running(server, ca_bundle, tmp_path):
    """SIGTERM as the kubelet sends it: the CLI's handler raises Interrupted in the main
    thread (installer.base.signals), blocked in a socket read here. The download runs in a
    child Python, which the test signals once its consumer thread runs and the server is
    answering its request (never the test runner itself)."""
    import signal
    import subprocess
    import sys
    import textwrap

    from tests.unit.net.test_transfer import trickle
    from tests.unit.test_signals import REPO, finish

    answering = threading.Event()

    def trickle_and_tell(request):
        answering.set()  # the child is inside the transfer's guarded request from here
        return trickle(request)

    server.expect_request("/slow").respond_with_handler(trickle_and_tell)
    code = textwrap.dedent(f"""
        import sys
        import threading
        from pathlib import Path
        import structlog
        from installer.base import signals
        from installer.net.session import make_session
        from tests.unit.net.test_stream import Consumer, run

        class Told(Consumer):
            def __call__(self, body):
                print("consuming", flush=True)
                return super().__call__(body)

        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout: ours
        session = make_session()
        session.verify = {str(ca_bundle)!r}
        consumer = Told()
        try:
            with signals.handled():
                run({server.url_for("/slow")!r}, consumer, Path({str(tmp_path)!r}), session)
        except signals.Interrupted as exc:
            alive = "download-consumer" in [t.name for t in threading.enumerate()]
            print("interrupted", exc.exit_code, consumer.runs, consumer.discards, alive)
    """)
    from tests.fixtures.https import ENV_TO_CLEAR

    # As the clean_env fixture: requests prefers REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE from the
    # environment over session.verify (Session.merge_environment_settings), and a machine
    # whose egress re-signs TLS sets them; the child must trust the test CA only.
    env = {k: v for k, v in os.environ.items()
           if k not in ENV_TO_CLEAR and "proxy" not in k.lower()}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**env, "NO_PROXY": "127.0.0.1,localhost"})
    try:
        assert proc.stdout.readline() == "consuming\n"  # the body trickles for 20 s at most
        assert answering.wait(timeout=30), "the child never requested the body"
        proc.send_signal(signal.SIGTERM)
        rc, out = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (rc, out.splitlines()[:1]) == (0, ["interrupted 143 1 1 False"]), out
