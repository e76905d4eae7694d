"""Starts an attnserve binary on 127.0.0.1 (ephemeral port) for a Python test, and stops it.

Shared by the Open Inference Protocol tests and the Python package's tests. The gRPC port is read
from the server's "attnserve listening on ... (port N)" log line, the REST port from the line that
follows it, "Open Inference Protocol REST at http[s]://host:N/v2" (or "REST off").
"""
import os
import re
import subprocess
import tempfile
import time

_PORT_LINE = re.compile(r"attnserve listening on .*\(port (\d+)\)")
_REST_LINE = re.compile(r"Open Inference Protocol REST at (https?)://[^ ]*:(\d+)/v2 ")
_REST_OFF_LINE = re.compile(r"REST off \(")


class LiveServer:
    """`with LiveServer(binary, "--model-repository", path) as server:` -> server.target.

    Also server.http_port (None when REST is off) and server.http_scheme ("http" or "https").
    """

    def __init__(self, binary, *args, startup_timeout_s=60.0):
        self._command = [binary, "--grpc-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
                         "--metrics-address", "",
                         "--compute-threads", "1", *args]
        self._timeout = startup_timeout_s
        self.target = None
        self.http_port = None
        self.http_scheme = None
        self.process = None

    def __enter__(self):
        self._log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
        self.process = subprocess.Popen(self._command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            with open(self._log.name) as log:
                text = log.read()
            match = _PORT_LINE.search(text)
            rest = _REST_LINE.search(text)
            # The REST line (or "REST off") follows the gRPC one; wait for it too.
            if match and (rest or _REST_OFF_LINE.search(text)):
                self.target = f"127.0.0.1:{match.group(1)}"
                if rest:
                    self.http_scheme = rest.group(1)
                    self.http_port = int(rest.group(2))
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.05)  # Polling a log file: no notification exists for it.
        self.__exit__(None, None, None)
        raise RuntimeError(f"attnserve did not start: {open(self._log.name).read()}")

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        os.unlink(self._log.name)
        return False
