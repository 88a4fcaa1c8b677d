"""A local Google Cloud Storage that TensorFlow's own gs:// client talks to, for tests.

TensorFlow 2.20's GCS filesystem (tsl/platform/cloud/gcs_file_system.cc, compiled into
libtensorflow_framework.so.2) has its endpoints hard-coded: JSON API calls go to
https://www.googleapis.com/storage/v1/, uploads to https://www.googleapis.com/upload/storage/v1/
and object reads to https://storage.googleapis.com/<bucket>/<object>; no variable points it
elsewhere (STORAGE_EMULATOR_HOST is not read). It talks through libcurl, which honours
`https_proxy`, and it reads `CURL_CA_BUNDLE` and `GOOGLE_AUTH_TOKEN_FOR_TESTING` (a fixed
bearer token instead of OAuth). So this module runs, in a child process:

  - `gcp-storage-emulator` (PyPI), in memory, with one bucket, on 127.0.0.1;
  - an HTTPS CONNECT proxy on 127.0.0.1 that accepts tunnels to those two Google hosts only,
    ends TLS with a certificate for them issued by a throwaway CA (`trustme`), and forwards each
    request unchanged to the emulator; it writes one JSON line per request to a log.

Two gaps of the emulator are closed, each in one place below, and nothing else is changed:
  - the proxy rewrites the scheme of a `Location` header: the emulator builds resumable-upload
    session URLs from the Host header as http://, where GCS returns https://;
  - an empty `uploadType=media` upload (TensorFlow makes "directories" as empty objects named
    `dir/`) crashes the emulator's handler (`len(None)`); it is given an empty body instead.
Every other byte of the requests and responses passes through as is. A request the emulator
fails on is answered 502 and logged, so it shows up as TensorFlow's retry error and in the log.
A request whose body the client did not finish sending (a process killed mid-upload) is not
forwarded, as GCS never acts on half a request; it is logged as "aborted".

Usage:

    with FakeGCS(folder, bucket="bucket") as gcs:
        subprocess.run(command, env={**os.environ, **gcs.env})   # gs://bucket/... works there
        gcs.requests()                                          # what the clients asked for

`folder` holds the CA certificate, the request log and the servers' own error output. The test
process may use the store itself too, with `gcs.env` set in `os.environ` before its first gs://
access (TensorFlow creates its GCS filesystem and reads its settings then); one FakeGCS per
process is what the tests do.
"""

import http.client
import http.server
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
# Headers that belong to one hop (RFC 9110 7.6.1) and are not forwarded; Expect: 100-continue
# is answered by the proxy itself (BaseHTTPRequestHandler does it).
_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "content-length",
}


class FakeGCS:
    """Starts the emulator and the proxy in a child process; `env` points TensorFlow at them."""

    def __init__(self, folder, bucket="bucket"):
        self.folder, self.bucket = str(folder), bucket
        self.ca_file = os.path.join(self.folder, "ca.pem")
        self.log_file = os.path.join(self.folder, "requests.jsonl")
        self._process = None
        self.env = None

    def __enter__(self):
        with open(os.path.join(self.folder, "server.log"), "w") as log:  # the servers' own errors, if any
            self._process = subprocess.Popen(
                [sys.executable, __file__, self.folder, self.bucket], stdout=subprocess.PIPE, stderr=log, text=True
            )
        line = self._process.stdout.readline()  # the proxy's port, once both servers listen
        if not line.strip().isdigit():
            self.__exit__()
            raise RuntimeError(f"the fake GCS did not start (exit code {self._process.returncode})")
        proxy = f"http://127.0.0.1:{line.strip()}"
        self.env = {
            "https_proxy": proxy,
            "HTTPS_PROXY": proxy,
            "no_proxy": "",
            "NO_PROXY": "",
            "CURL_CA_BUNDLE": self.ca_file,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake-token",  # no OAuth round trip
            "NO_GCE_CHECK": "true",  # never probe the GCE metadata server for credentials
        }
        return self

    def __exit__(self, *exc_info):
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            self._process.wait(timeout=30)

    def requests(self):
        """Every request so far: dicts with method, host, path, range, content_range, status ("aborted":
        the client went away before sending the whole body, and it was not forwarded), sent and received
        (body bytes), time (when it arrived) and seconds (until answered)."""
        with open(self.log_file, encoding="utf-8") as file:
            return [json.loads(line) for line in file]


class _TunnelHandler(http.server.BaseHTTPRequestHandler):
    """CONNECT to a Google host -> TLS -> each request inside is forwarded to the emulator."""

    protocol_version = "HTTP/1.1"  # keep-alive, as curl expects inside a tunnel

    def do_CONNECT(self):
        host = self.path.rsplit(":", 1)[0]
        if host not in GOOGLE_HOSTS:
            self.send_error(403, f"this proxy only tunnels to {GOOGLE_HOSTS}")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        # As curl does on its side: without it Nagle's algorithm held part of each answer until the client's
        # delayed ACK, ~45 ms a request (a tiny BERT's run on gs://: 61 s, 39 s with it; served the same).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # From here on, handle() reads the tunnelled requests from the TLS stream.
        self.connection = self.server.tls.wrap_socket(self.connection, server_side=True)
        self.rfile = self.connection.makefile("rb")
        self.wfile = self.connection.makefile("wb")  # flushed after each request by handle_one_request
        self.close_connection = False

    def handle_expect_100(self):
        answered = super().handle_expect_100()
        self.wfile.flush()  # the 100 Continue goes out now: curl would wait a second for it before sending the body
        return answered

    def _forward(self):
        self.started = time.time()
        body = self._read_body()
        if body is None:  # the client went away mid-body (a killed process): GCS never gets such a request
            self.close_connection = True
            self._log("aborted", 0, 0)
            return
        headers = {name: value for name, value in self.headers.items() if name.lower() not in _HOP_HEADERS}
        emulator = http.client.HTTPConnection("127.0.0.1", self.server.emulator_port, timeout=120)
        try:
            emulator.request(self.command, self.path, body=body or None, headers=headers)
            response = emulator.getresponse()
            data = response.read()
        except (http.client.HTTPException, OSError):  # the emulator failed on this request
            self.send_error(502, "the emulator failed on this request")
            self._log(502, len(body), 0)
            return
        finally:
            emulator.close()
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() in _HOP_HEADERS or name.lower() in ("date", "server"):
                continue
            if name.lower() == "location":  # the emulator's session URL says http://; GCS says https://
                value = value.replace("http://", "https://", 1)
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self._log(response.status, len(body), len(data))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

    def _read_body(self):
        """The request's body (b"" if none); None if the client went away before sending all of it."""
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            return body if len(body) == length else None
        chunks = []  # TensorFlow (libcurl) sends its POST and PUT bodies chunked
        while size_line := self.rfile.readline():
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while self.rfile.readline().strip():  # trailers
                    pass
                return b"".join(chunks)
            chunks.append(self.rfile.read(size + 2)[:size])  # + CRLF
            if len(chunks[-1]) < size:
                return None
        return None

    def _log(self, status, sent, received):
        entry = {
            "method": self.command,
            "host": self.headers.get("Host"),
            "path": self.path,
            "range": self.headers.get("Range"),
            "content_range": self.headers.get("Content-Range"),
            "status": status,
            "sent": sent,
            "received": received,
            "time": self.started,
            "seconds": round(time.time() - self.started, 4),
        }
        with self.server.log_lock, open(self.server.log_file, "a", encoding="utf-8") as file:
            file.write(json.dumps(entry) + "\n")

    def log_message(self, format, *args):  # the JSON log above is the record
        pass


def _accept_empty_media_uploads(objects):
    """The emulator's media upload takes `len(request.data)`, None for an empty body."""
    media_upload = objects._media_upload

    def media_upload_with_empty_body(request, response, storage):
        if request.data is None:
            request._data = b""
        return media_upload(request, response, storage)

    objects._media_upload = media_upload_with_empty_body


def _serve(folder, bucket):
    import logging

    import trustme
    from gcp_storage_emulator.handlers import objects
    from gcp_storage_emulator.server import create_server

    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
    _accept_empty_media_uploads(objects)
    authority = trustme.CA()
    authority.cert_pem.write_to_path(os.path.join(folder, "ca.pem"))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert(*GOOGLE_HOSTS).configure_cert(tls)

    with socket.socket() as probe:  # a free port for the emulator (its server does not report the one it got)
        probe.bind(("127.0.0.1", 0))
        emulator_port = probe.getsockname()[1]
    emulator = create_server("127.0.0.1", emulator_port, in_memory=True, default_bucket=bucket)
    emulator.start()
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TunnelHandler)
    proxy.daemon_threads = True
    proxy.tls, proxy.emulator_port = tls, emulator_port
    proxy.log_file, proxy.log_lock = os.path.join(folder, "requests.jsonl"), threading.Lock()
    open(proxy.log_file, "w").close()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=proxy.shutdown).start())
    print(proxy.server_address[1], flush=True)
    proxy.serve_forever()
    emulator.stop()


if __name__ == "__main__":
    _serve(*sys.argv[1:3])
