"""A fault-injecting HTTP proxy between the S3 client and a moto server, for the store tests.

Real S3 answers `503 Slow Down` under load and drops connections now and then; the
store must ride through both on retries. This proxy forwards each request to moto,
except the next `count` requests, which get one of three faults:
- "503": a 503 with an S3-style XML error body (code SlowDown), then the connection closes;
- "reset": the connection is closed abruptly (TCP RST) before any response;
- "stall": nothing is sent back, so only the client's read timeout ends the wait;
- "lost": the request reaches moto and is done, then the connection is reset before its answer (the
  client's retry meets its own write).
"""
from __future__ import annotations

import http.client
import socket
import socketserver
import struct
import threading
from dataclasses import dataclass

SLOW_DOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                  b"<Message>Please reduce your request rate.</Message><RequestId>FAULT</RequestId></Error>")
HOP_HEADERS = {"connection", "content-length", "expect", "transfer-encoding", "keep-alive"}
FOREVER = -1


@dataclass
class FaultPlan:
    """Which fault the next requests get, and how many more of them (FOREVER: never stop); or, with
    `every` > 0, every `every`-th request from now on (faults sprinkled through a whole run)."""
    kind: str | None = None
    remaining: int = 0
    every: int = 0
    seen: int = 0
    method: str = ""
    """Only requests with this HTTP method (e.g. PUT: uploads); empty: any."""
    path_part: str = ""
    """Only requests whose target contains this (e.g. /checkpoints/); empty: any."""


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str:
        return next((value for key, value in self.headers if key.lower() == name), "")


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.plan = FaultPlan()
        self.faults_served = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), ProxyHandler)
        self.server.daemon_threads = True
        self.server.proxy = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def inject(self, kind: str | None, count: int, method: str = "", path_part: str = "") -> None:
        with self.lock:
            self.plan = FaultPlan(kind, count, method=method, path_part=path_part)
            self.faults_served = 0

    def inject_every(self, kind: str, every: int) -> None:
        with self.lock:
            self.plan = FaultPlan(kind, 0, every)
            self.faults_served = 0

    def take_fault(self, request: Request) -> str | None:
        with self.lock:
            if (self.plan.method and request.method != self.plan.method) or self.plan.path_part not in request.target:
                return None
            if self.plan.kind is not None and self.plan.every > 0:
                self.plan.seen += 1
                if self.plan.seen % self.plan.every:
                    return None
                self.faults_served += 1
                return self.plan.kind
            if self.plan.kind is None or self.plan.remaining == 0:
                return None
            if self.plan.remaining > 0:
                self.plan.remaining -= 1
            self.faults_served += 1
            return self.plan.kind

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


class ProxyHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        proxy: FaultProxy = self.server.proxy  # type: ignore[attr-defined]
        while not proxy.stopping.is_set():
            request = self.read_head()
            if request is None:
                return
            fault = proxy.take_fault(request)
            expects_continue = request.header("expect").lower() == "100-continue"
            if fault == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            if fault == "stall":
                proxy.stopping.wait(30)
                return
            if fault == "503":
                if not expects_continue:
                    self.read_body(request)
                self.send_slow_down(request)
                return
            if expects_continue:
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.forward(proxy, request, self.read_body(request), answer=fault != "lost")
            if fault == "lost":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return

    def read_head(self) -> Request | None:
        line = self.rfile.readline()
        if not line.strip():
            return None
        method, target, _ = line.decode("latin-1").split(" ", 2)
        headers = []
        while (header := self.rfile.readline().decode("latin-1").rstrip("\r\n")):
            name, _, value = header.partition(":")
            headers.append((name.strip(), value.strip()))
        return Request(method, target, headers)

    def read_body(self, request: Request) -> bytes:
        if request.header("transfer-encoding").lower() == "chunked":
            chunks = []
            while (size := int(self.rfile.readline().split(b";")[0], 16)):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return b"".join(chunks)
        return self.rfile.read(int(request.header("content-length") or 0))

    def send_slow_down(self, request: Request) -> None:
        head = (f"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(SLOW_DOWN_BODY)}\r\nConnection: close\r\n\r\n").encode()
        self.wfile.write(head + (b"" if request.method == "HEAD" else SLOW_DOWN_BODY))

    def forward(self, proxy: FaultProxy, request: Request, body: bytes, answer: bool = True) -> None:
        upstream = http.client.HTTPConnection(*proxy.upstream, timeout=30)
        try:
            upstream.putrequest(request.method, request.target, skip_host=True, skip_accept_encoding=True)
            for name, value in request.headers:
                if name.lower() not in HOP_HEADERS:
                    upstream.putheader(name, value)
            upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body)
            response = upstream.getresponse()
            payload = response.read()
            headers = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_HEADERS]
            length = response.getheader("content-length", "0") if request.method == "HEAD" else str(len(payload))
        finally:
            upstream.close()
        if not answer:
            return
        lines = [f"HTTP/1.1 {response.status} {response.reason}"] + [f"{k}: {v}" for k, v in headers]
        lines.append(f"Content-Length: {length}")
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
