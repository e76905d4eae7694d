"""Starts an attnserve binary on 127.0.0.1 (ephemeral port) for a Python test, and stops it.

Shared by the Open Inference Protocol test and the Python package's tests. The port is read from
the server's "attnserve listening on ... (port N)" log line.
"""
import os
import re
import subprocess
import tempfile
import time

_PORT_LINE = re.compile(r"attnserve listening on .*\(port (\d+)\)")


class LiveServer:
    """`with LiveServer(binary, "--model-repository", path) as server:` -> server.target."""

    def __init__(self, binary, *args, startup_timeout_s=60.0):
        self._command = [binary, "--grpc-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
                         "--metrics-address", "",
                         "--compute-threads", "1", *args]
        self._timeout = startup_timeout_s
        self.target = None
        self.process = None

    def __enter__(self):
        self._log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
        self.process = subprocess.Popen(self._command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            with open(self._log.name) as log:
                match = _PORT_LINE.search(log.read())
            if match:
                self.target = f"127.0.0.1:{match.group(1)}"
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
