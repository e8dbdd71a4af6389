"""A real etcd for the rendezvous tests: Debian's etcd-server on free localhost ports, started per test (about a
second) and killed after. Without the ``etcd`` binary the tests skip with the reason, except under CI (the
variable CI set), where they fail: .ci/run installs etcd-server, so a missing binary there is a broken setup."""
import dataclasses
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request

import pytest


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(data_dir, address="127.0.0.1", prefix=(), tls=None, flags=()):
    """Starts etcd serving clients on ``address``:<free port> (``prefix``: a command to run it under, e.g. ``ip
    netns exec NS``; ``tls``: a ``Certificates`` whose server certificate it serves and whose CA must have signed
    every client's); returns (process, client URL) once it answers. A port another process took between
    ``free_port`` and etcd's bind (tests run two at a time) is retried on new ports, up to three times."""
    for attempt in range(3):
        attempt_dir = str(data_dir) if attempt == 0 else f"{data_dir}-{attempt}"
        started = _start_etcd_once(attempt_dir, address, prefix, tls, flags)
        if started is not None:
            return started
    raise RuntimeError(f"etcd did not start in 3 tries, each on a port taken: {open(attempt_dir + '.log').read()[-1000:]}")


def _start_etcd_once(data_dir, address, prefix, tls, flags):
    """(process, URL), or None when etcd could not bind its ports; raises on any other failure."""
    client, peer = free_port(), free_port()
    url = f"{'https' if tls else 'http'}://{address}:{client}"
    command = [*prefix, "etcd", "--name", "t", "--data-dir", data_dir, "--listen-client-urls", url,
               "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
               "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
               "--initial-cluster", f"t=http://127.0.0.1:{peer}", *flags]
    context = None
    if tls:
        command += ["--cert-file", tls.server[0], "--key-file", tls.server[1], "--trusted-ca-file", tls.ca,
                    "--client-cert-auth"]
        context = ssl.create_default_context(cafile=tls.ca)
        context.check_hostname = False  # the probe asks whether it is up; the tests check its names
        context.load_cert_chain(*tls.client)
    log_path = data_dir + ".log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    probe = f"import urllib.request; urllib.request.urlopen({url + '/health'!r}, timeout=1).read()"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if prefix:  # served inside a namespace: ask from there
            if subprocess.run([*prefix, sys.executable, "-c", probe], stderr=subprocess.DEVNULL).returncode == 0:
                return proc, url
        else:
            try:
                urllib.request.urlopen(url + "/health", timeout=1, context=context).read()
                return proc, url
            except OSError:
                pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    stop_etcd(proc)
    output = open(log_path).read()
    if "address already in use" in output:
        return None
    raise RuntimeError(f"etcd did not start: {output[-1000:]}")


def stop_etcd(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def require_etcd():
    if shutil.which("etcd"):
        return
    reason = "the etcd binary is not installed (apt-get install -y etcd-server)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, where .ci/run installs it")
    pytest.skip(reason)


@pytest.fixture
def etcd_url(tmp_path):
    """The client URL of a fresh etcd on localhost, killed after the test."""
    require_etcd()
    proc, url = start_etcd(tmp_path / "etcd")
    try:
        yield url
    finally:
        stop_etcd(proc)


@dataclasses.dataclass(frozen=True)
class Certificates:
    """A CA of the test's own and what it signed (each a (certificate, key) pair of PEM files): etcd's server
    certificate for 127.0.0.1 and localhost, and a client certificate for the job's agents."""
    ca: str
    ca_key: str
    server: tuple
    client: tuple


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   timeout=30)


def make_certificates(directory, name="job", server_names="IP:127.0.0.1,DNS:localhost") -> Certificates:
    """A fresh CA in ``directory`` (the ``openssl`` command line; P-256 keys, a day's validity) and a server and a
    client certificate it signed: the recipe docs/healing.md 'Security' gives."""
    if not shutil.which("openssl"):
        pytest.skip("the openssl command is not installed")
    directory = str(directory)
    os.makedirs(directory, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", f"/CN={name}-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=directory)
    pairs = {}
    # etcd's own certificate is a client's too: its JSON gateway connects to etcd with it (etcd 3.4)
    for who, alt, usage in (("server", server_names, "serverAuth,clientAuth"),
                            ("client", f"DNS:{name}-agent", "clientAuth")):
        with open(os.path.join(directory, f"{who}.ext"), "w") as f:
            f.write(f"subjectAltName={alt}\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n"
                    "keyUsage=critical,digitalSignature\nsubjectKeyIdentifier=hash\n"
                    "authorityKeyIdentifier=keyid,issuer\n")
        _openssl("req", *key, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN={name}-{who}",
                 cwd=directory)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{who}.pem", "-days", "1", "-extfile", f"{who}.ext", cwd=directory)
        pairs[who] = (os.path.join(directory, f"{who}.pem"), os.path.join(directory, f"{who}.key"))
    return Certificates(os.path.join(directory, "ca.pem"), os.path.join(directory, "ca.key"), pairs["server"],
                        pairs["client"])


@pytest.fixture
def tls_etcd(tmp_path):
    """(client URL, Certificates) of a fresh etcd on localhost that serves TLS and takes only clients with a
    certificate its CA signed (--client-cert-auth), killed after the test."""
    require_etcd()
    certificates = make_certificates(tmp_path / "pki")
    proc, url = start_etcd(tmp_path / "etcd", tls=certificates)
    try:
        yield url, certificates
    finally:
        stop_etcd(proc)
