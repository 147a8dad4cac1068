"""An OAuth 2 token endpoint (the client-credentials grant, RFC 6749 4.4) on loopback, for the
OAUTHBEARER tests: what Kafka's OIDC login handler and librdkafka's ``sasl.oauthbearer.method=
oidc`` fetch a token from before they log in.

It checks the client's id and secret (HTTP Basic, or the form's ``client_id`` /
``client_secret``) and issues an unsigned JWT whose subject is the client id; the secured
listener accepts that subject. :attr:`TokenEndpoint.grants` records each grant's client and
scope for the tests to check.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LIFETIME_S = 3600


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def unsigned_jwt(subject: str, scope: str) -> str:
    now = int(time.time())
    claims = {"sub": subject, "iat": now, "exp": now + LIFETIME_S, "scope": scope}
    return f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}."


class TokenEndpoint:
    """A context manager serving ``url`` for the one client ``client_id`` / ``client_secret``."""

    def __init__(self, client_id: str, client_secret: str) -> None:
        self.client_id, self.client_secret = client_id, client_secret
        self.grants: list[dict[str, str]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                client = endpoint.client_of(self.headers.get("Authorization"), form)
                if form.get("grant_type") != "client_credentials" or client is None:
                    self._reply(401, {"error": "invalid_client"})
                    return
                scope = form.get("scope", "")
                endpoint.grants.append({"client_id": client, "scope": scope})
                self._reply(200, {"access_token": unsigned_jwt(client, scope),
                                  "token_type": "bearer", "expires_in": LIFETIME_S})

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # the tests check grants, not access logs

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/oauth2/token"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="token-endpoint")

    def client_of(self, authorization: str | None, form: dict[str, str]) -> str | None:
        """The client the request authenticates as, if its credentials are right."""
        client, secret = form.get("client_id"), form.get("client_secret")
        if authorization and authorization.lower().startswith("basic "):
            decoded = base64.b64decode(authorization[6:]).decode()
            client, _, secret = (urllib.parse.unquote_plus(p) for p in decoded.partition(":"))
        if client == self.client_id and secret == self.client_secret:
            return client
        return None

    def __enter__(self) -> TokenEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
