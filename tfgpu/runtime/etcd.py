"""etcd's v3 JSON gateway as the rendezvous speaks it (``runtime/rendezvous.py``), with the standard library only:
over ``http://`` or ``https://`` with a CA and a client certificate (``ssl``), and with etcd's user/password auth
(a token, fetched again when etcd says it expired).

The endpoint is ``etcd://HOST:PORT/JOB[?protocol=https&cacert=CA.pem&cert=CERT.pem&key=KEY.pem&user=NAME]`` (the
options torchrun's etcd rendezvous takes), each option also from the environment for Slurm and Kubernetes
templates (``ENVIRONMENT``; the URL wins). The password is only ever read from ``TFGPU_ETCD_PASSWORD`` or the file
``TFGPU_ETCD_PASSWORD_FILE`` names: a command line is visible to every user of the host (``ps``).
"""
import base64
import dataclasses
import json
import os
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request

ENVIRONMENT = {"protocol": "TFGPU_ETCD_PROTOCOL", "cacert": "TFGPU_ETCD_CACERT", "cert": "TFGPU_ETCD_CERT",
               "key": "TFGPU_ETCD_KEY", "user": "TFGPU_ETCD_USER"}
PASSWORD_ENV, PASSWORD_FILE_ENV = "TFGPU_ETCD_PASSWORD", "TFGPU_ETCD_PASSWORD_FILE"
FORM = "etcd://HOST:PORT/JOB_ID[?protocol=https&cacert=CA.pem&cert=CERT.pem&key=KEY.pem&user=NAME]"


class RendezvousError(RuntimeError):
    """etcd cannot be reached or refused a request; the message names the endpoint and what to fix."""


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where the job's etcd is and how to speak to it."""
    url: str  # http(s)://HOST:PORT
    job: str
    cacert: str = ""
    cert: str = ""
    key: str = ""
    user: str = ""
    password: str = dataclasses.field(default="", repr=False)

    @property
    def tls(self) -> bool:
        return self.url.startswith("https://")


def parse(text: str, environ=None) -> Endpoint:
    """``--rendezvous`` (and the ``TFGPU_ETCD_*`` variables of ``environ``, default ``os.environ``) -> Endpoint;
    ValueError naming the option to fix."""
    environ = os.environ if environ is None else environ
    parsed = urllib.parse.urlsplit(text)
    job = parsed.path.strip("/")
    try:
        port = parsed.port or 2379
    except ValueError:
        port = None
    if parsed.scheme != "etcd" or not parsed.hostname or not job or "/" in job or port is None:
        raise ValueError(f"--rendezvous={text!r}: expected {FORM} (e.g. etcd://10.0.0.1:2379/run7)")
    query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
    if "password" in query:
        raise ValueError(f"--rendezvous: a password on the command line is visible to every user of the host (ps): "
                         f"put it in {PASSWORD_ENV} or in a file {PASSWORD_FILE_ENV} names")
    unknown = sorted(set(query) - set(ENVIRONMENT))
    if unknown:
        raise ValueError(f"--rendezvous: unknown option {unknown[0]!r}; expected {FORM}")
    options = {name: query[name][-1] if name in query else environ.get(var, "") for name, var in ENVIRONMENT.items()}

    def where(name):  # the option as the user set it
        return ENVIRONMENT[name] if name not in query and environ.get(ENVIRONMENT[name]) else name

    tls_files = [n for n in ("cacert", "cert", "key") if options[n]]
    protocol = options["protocol"] or ("https" if tls_files else "http")
    if protocol not in ("http", "https"):
        raise ValueError(f"--rendezvous: {where('protocol')}={protocol!r}, expected http or https")
    if protocol == "http" and tls_files:
        raise ValueError(f"--rendezvous: {where(tls_files[0])} is set with protocol=http: TLS files need "
                         "protocol=https")
    if bool(options["cert"]) != bool(options["key"]):
        have, missing = ("cert", "key") if options["cert"] else ("key", "cert")
        raise ValueError(f"--rendezvous: {where(have)} is set without {missing}: a client certificate needs both")
    for name in tls_files:
        if not os.access(options[name], os.R_OK) or not os.path.isfile(options[name]):
            raise ValueError(f"--rendezvous: {where(name)}={options[name]!r} is not a readable file")
    password = environ.get(PASSWORD_ENV, "")
    if not password and environ.get(PASSWORD_FILE_ENV):
        try:
            with open(environ[PASSWORD_FILE_ENV]) as f:
                password = f.read().rstrip("\n")
        except OSError as e:
            raise ValueError(f"{PASSWORD_FILE_ENV}={environ[PASSWORD_FILE_ENV]!r} cannot be read: {e.strerror}") \
                from None
    if options["user"] and not password:
        raise ValueError(f"--rendezvous: {where('user')} is set but no password: set {PASSWORD_ENV} or "
                         f"{PASSWORD_FILE_ENV}")
    endpoint = Endpoint(f"{protocol}://{parsed.hostname}:{port}", job, options["cacert"], options["cert"],
                        options["key"], options["user"], password if options["user"] else "")
    if endpoint.tls:
        _tls_context(endpoint)  # a file that is no PEM of its kind: said now, before anything starts
    return endpoint


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix: str) -> str:
    """etcd's range_end for every key that starts with ``prefix`` (its last byte plus one)."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


_EXPIRED = ("invalid auth token", "auth token is expired")


class Etcd:
    """The few etcd v3 calls a rendezvous needs, as JSON over HTTP(S) (``/v3/kv/*``, ``/v3/lease/*``); ``endpoint``
    an Endpoint or a plain ``http://HOST:PORT``."""

    def __init__(self, endpoint, timeout_s: float = 5.0):
        self.endpoint = endpoint if isinstance(endpoint, Endpoint) else Endpoint(endpoint.rstrip("/"), "")
        self.url = self.endpoint.url
        self.timeout_s = timeout_s
        self.context = _tls_context(self.endpoint) if self.endpoint.tls else None
        self._token = None
        self._auth_lock = threading.Lock()

    def call(self, path: str, body: dict, _fresh_token: bool = False) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.endpoint.user:
            headers["Authorization"] = self._authenticate(_fresh_token)
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self.context) as response:
                answer = json.loads(response.read().decode() or "{}")
        except urllib.error.HTTPError as e:
            text = _message(e.read().decode(errors="replace"))
            if self.endpoint.user and not _fresh_token and any(x in text for x in _EXPIRED):
                return self.call(path, body, _fresh_token=True)  # the token expired (--auth-token-ttl): a new one
            raise RendezvousError(f"etcd at {self.url}{path}: HTTP {e.code}: {text}{self._auth_hint(text)}") \
                from None
        except (OSError, ValueError) as e:
            raise RendezvousError(self._connection_line(path, getattr(e, "reason", e))) from None
        if "error" in answer:
            message = str(answer.get("message", answer["error"]))
            if self.endpoint.user and not _fresh_token and any(x in message for x in _EXPIRED):
                return self.call(path, body, _fresh_token=True)
            raise RendezvousError(f"etcd at {self.url}{path}: {message}{self._auth_hint(message)}")
        return answer

    def _authenticate(self, fresh: bool) -> str:
        """etcd's auth token for the endpoint's user, fetched once and again when ``fresh`` (it expired)."""
        with self._auth_lock:
            if self._token is None or fresh:
                request = urllib.request.Request(
                    self.url + "/v3/auth/authenticate", method="POST", headers={"Content-Type": "application/json"},
                    data=json.dumps({"name": self.endpoint.user, "password": self.endpoint.password}).encode())
                try:
                    with urllib.request.urlopen(request, timeout=self.timeout_s, context=self.context) as response:
                        self._token = json.loads(response.read().decode())["token"]
                except urllib.error.HTTPError as e:
                    text = _message(e.read().decode(errors="replace"))
                    raise RendezvousError(f"etcd at {self.url} refused user {self.endpoint.user!r} "
                                          f"(user= or TFGPU_ETCD_USER, and {PASSWORD_ENV}): {text}") from None
                except (OSError, ValueError, KeyError) as e:
                    raise RendezvousError(self._connection_line("/v3/auth/authenticate",
                                                                getattr(e, "reason", e))) from None
            return self._token

    def _auth_hint(self, text: str) -> str:
        """What to fix when etcd's auth refused a request."""
        if "user name is empty" in text and not self.endpoint.user:
            return f" (etcd has auth enabled: set user= or TFGPU_ETCD_USER, and {PASSWORD_ENV})"
        if "permission denied" in text:
            return f" (user {self.endpoint.user!r} needs a role granting readwrite on /tfgpu/{self.endpoint.job}/)"
        return ""

    def _connection_line(self, path: str, reason) -> str:
        """One line for a request that got no answer: a TLS failure says which option to fix."""
        where = f"etcd at {self.url}"
        text = str(reason)
        if isinstance(reason, ssl.SSLCertVerificationError):
            host = urllib.parse.urlsplit(self.url).hostname
            if "mismatch" in (reason.verify_message or ""):
                return (f"{where}: TLS: etcd's certificate is not valid for {host} ({reason.verify_message}): "
                        f"name etcd in --rendezvous as its certificate does (a name or IP in its subjectAltName)")
            return (f"{where}: TLS: etcd's certificate is not signed by cacert="
                    f"{self.endpoint.cacert or '(the system CAs)'} ({reason.verify_message}): set cacert= (or "
                    f"TFGPU_ETCD_CACERT) to the CA that signed etcd's --cert-file")
        if self.endpoint.tls and "WRONG_VERSION_NUMBER" in text:
            return f"{where} does not speak TLS ({text}): drop protocol=https (and cacert/cert/key) from --rendezvous"
        refused = any(x in text.upper() for x in ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA",
                                                  "CERTIFICATE_UNKNOWN", "HANDSHAKE_FAILURE"))
        # etcd (Go) closes the handshake on a client certificate it does not take: an EOF here, an alert or a reset
        closed = isinstance(reason, (ssl.SSLEOFError, ConnectionResetError, BrokenPipeError))
        if self.endpoint.tls and (refused or closed):
            have = f"cert={self.endpoint.cert}" if self.endpoint.cert else "no client certificate"
            return (f"{where}: TLS: etcd refused this client ({have}; {text}): set cert= and key= (or "
                    "TFGPU_ETCD_CERT and TFGPU_ETCD_KEY) to a certificate signed by the CA of etcd's "
                    "--trusted-ca-file")
        if not self.endpoint.tls and (isinstance(reason, ConnectionResetError) or "HTTPS" in text
                                      or "RemoteDisconnected" in type(reason).__name__):
            return (f"{where} closed the connection ({text or type(reason).__name__}; {path}): if it serves TLS "
                    f"(--cert-file), add ?protocol=https&cacert=CA.pem&cert=CERT.pem&key=KEY.pem to --rendezvous")
        return f"{where} cannot be reached ({path}): {text or type(reason).__name__}"

    def get(self, key: str):
        """(value, mod_revision) of ``key``; (None, 0) when absent."""
        kvs = self.call("/v3/kv/range", {"key": b64(key)}).get("kvs", [])
        if not kvs:
            return None, 0
        return base64.b64decode(kvs[0].get("value", "")).decode(), int(kvs[0]["mod_revision"])

    def get_prefix(self, prefix: str) -> dict:
        """{key: value} of every key under ``prefix``."""
        kvs = self.call("/v3/kv/range", {"key": b64(prefix), "range_end": prefix_end(prefix)}).get("kvs", [])
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode() for kv in kvs}

    def put(self, key: str, value: str, lease: str | None = None) -> None:
        body = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = lease
        self.call("/v3/kv/put", body)

    def put_if(self, key: str, value: str, mod_revision: int) -> bool:
        """Writes ``key`` only if its mod_revision is still ``mod_revision`` (0: only if absent); whether it did."""
        return bool(self.call("/v3/kv/txn", {
            "compare": [{"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}],
            "success": [{"request_put": {"key": b64(key), "value": b64(value)}}]}).get("succeeded"))

    def grant(self, ttl_s: int) -> str:
        return self.call("/v3/lease/grant", {"TTL": str(int(ttl_s))})["ID"]

    def keepalive(self, lease: str) -> bool:
        """Renews ``lease``; False when it has expired already."""
        answer = self.call("/v3/lease/keepalive", {"ID": lease})
        return int(answer.get("result", answer).get("TTL", 0)) > 0

    def revoke(self, lease: str) -> None:
        self.call("/v3/lease/revoke", {"ID": lease})


def _message(body: str) -> str:
    """The message of etcd's JSON error ``body``, or its first 200 characters."""
    try:
        return str(json.loads(body)["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return body[:200]


def _tls_context(endpoint: Endpoint) -> ssl.SSLContext:
    """Verifies etcd's certificate against ``cacert`` (the system CAs without one) and its host name; presents the
    client certificate when one is given. ValueError naming the option whose file is no PEM of its kind."""
    try:
        context = ssl.create_default_context(cafile=endpoint.cacert or None)
    except (ssl.SSLError, OSError) as e:
        raise ValueError(f"--rendezvous: cacert={endpoint.cacert!r} is no PEM CA certificate ({e})") from None
    if endpoint.cert:
        try:
            context.load_cert_chain(endpoint.cert, endpoint.key)
        except (ssl.SSLError, OSError) as e:
            raise ValueError(f"--rendezvous: cert={endpoint.cert!r} and key={endpoint.key!r} are no PEM certificate "
                             f"and its private key ({e})") from None
    return context
