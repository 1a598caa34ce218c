#!/usr/bin/env python3
"""Loopback static file server for bench/supply.sh: the same server feeds kiln and curl.

Serves DIR on 127.0.0.1 (port written to PORTFILE), threaded, zero-copy (sendfile), with
single-range `Range: bytes=N-` support, and counts every body byte it hands to the kernel.
GET /__stats returns that count. Usage: supply_server.py DIR PORTFILE
"""
import http.server
import os
import sys
import threading

ROOT = os.path.abspath(sys.argv[1])
SENT = 0
LOCK = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        global SENT
        if self.path == "/__stats":
            body = str(SENT).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        path = os.path.normpath(os.path.join(ROOT, self.path.lstrip("/").split("?")[0]))
        if not path.startswith(ROOT) or not os.path.isfile(path):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = os.path.getsize(path)
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng[6:].endswith("-"):
            start = int(rng[6:-1])
        if start >= size and size > 0:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(size - start))
        self.send_header("Accept-Ranges", "bytes")
        if start:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        self.wfile.flush()
        with open(path, "rb") as f:
            offset = start
            while offset < size:
                try:
                    n = os.sendfile(self.connection.fileno(), f.fileno(), offset, size - offset)
                except (BrokenPipeError, ConnectionResetError):
                    break
                if n == 0:
                    break
                offset += n
                with LOCK:
                    SENT += n


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


srv = Server(("127.0.0.1", 0), Handler)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
srv.serve_forever()
