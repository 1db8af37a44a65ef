"""The calls beside the chat API share the process's one client: made on first use, its connection kept."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading

from chat.agent import server_api
from chat.agent.model import transport


class _Tokenizer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps the connection open, as llama-server does
    peers: list[tuple[str, int]] = []

    def do_POST(self) -> None:
        self.peers.append(self.client_address)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = json.dumps({"tokens": [1, 2, 3]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_calls_share_one_kept_connection() -> None:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Tokenizer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    server_api.forget(base)
    try:
        for _ in range(5):
            assert server_api.tokenize(base, "a b c") == [1, 2, 3]
        assert len(_Tokenizer.peers) == 5
        assert len(set(_Tokenizer.peers)) == 1, "one connection for every call"
        assert transport.shared_client() is transport.shared_client()
    finally:
        httpd.shutdown()
        httpd.server_close()
        server_api.forget(base)


def test_importing_the_clients_starts_nothing() -> None:
    code = (
        "import threading\n"
        "from chat.agent import server_api\n"
        "from chat.agent.model import transport\n"
        "assert transport._shared is None, 'no client yet'\n"
        "assert threading.active_count() == 1, 'no thread'\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr
