"""etcd as the rendezvous speaks it (``runtime/etcd.py``): the endpoint's options in-process; TLS with client
certificates against a real etcd started with --cert-file/--key-file/--trusted-ca-file/--client-cert-auth on
loopback (``tls_etcd``: tests/runtime/conftest.py, certificates made by the test), where a client without the job's
certificate, with another CA's or expecting another CA is refused in one line naming the option to fix; etcd's
user/password auth, its token fetched again once it expired."""
import time

import pytest

from tests.runtime.conftest import make_certificates, require_etcd, start_etcd, stop_etcd
from tfgpu import launch
from tfgpu.runtime import etcd, rendezvous


def _pem(tmp_path, name):
    path = tmp_path / name
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return str(path)


def test_tls_options_come_from_the_url_or_the_environment_the_url_winning(tmp_path):
    ca, cert, key = (_pem(tmp_path, n) for n in ("ca.pem", "c.pem", "c.key"))
    query = etcd.parse("etcd://h:1/j?protocol=http", {})
    assert (query.url, query.job, query.tls) == ("http://h:1", "j", False)
    env = {"TFGPU_ETCD_CACERT": ca, "TFGPU_ETCD_CERT": cert, "TFGPU_ETCD_KEY": key}
    with pytest.raises(ValueError, match=r"cacert=.*ca.pem' is no PEM CA certificate"):
        etcd.parse("etcd://h/j", env)  # https implied by the files; then the files are read
    with pytest.raises(ValueError, match=r"TFGPU_ETCD_CERT is set with protocol=http: TLS files need protocol=https"):
        etcd.parse("etcd://h/j?protocol=http", {"TFGPU_ETCD_CERT": cert, "TFGPU_ETCD_KEY": key})


@pytest.mark.parametrize("query, environ, message", [
    ("?password=x", {}, r"a password on the command line is visible .* TFGPU_ETCD_PASSWORD"),
    ("?cafile=x", {}, r"unknown option 'cafile'"),
    ("?protocol=ftp", {}, r"protocol='ftp', expected http or https"),
    ("?cert=CERT", {}, r"cert is set without key: a client certificate needs both"),
    ("", {"TFGPU_ETCD_KEY": "KEY"}, r"TFGPU_ETCD_KEY is set without cert"),
    ("?cacert=/nonexistent/ca.pem", {}, r"cacert='/nonexistent/ca.pem' is not a readable file"),
    ("?user=agent", {}, r"user is set but no password: set TFGPU_ETCD_PASSWORD or TFGPU_ETCD_PASSWORD_FILE"),
    ("", {"TFGPU_ETCD_USER": "a", "TFGPU_ETCD_PASSWORD_FILE": "/nonexistent"},
     r"TFGPU_ETCD_PASSWORD_FILE='/nonexistent' cannot be read"),
])
def test_a_bad_option_is_one_line_naming_it(tmp_path, query, environ, message):
    environ = {k: v.replace("KEY", _pem(tmp_path, "k")) for k, v in environ.items()}
    with pytest.raises(ValueError, match=message):
        etcd.parse("etcd://h:2379/j" + query.replace("CERT", _pem(tmp_path, "c")), environ)


def test_the_launcher_says_a_bad_option_before_anything_starts(capsys):
    assert launch.main(["--num_workers=2", "--rendezvous=etcd://h/j?cert=/x", "--", "true"]) == 1
    assert capsys.readouterr().err.strip() == "error: --rendezvous: cert is set without key: a client " \
                                               "certificate needs both"


def _endpoint(url, certificates=None, client=None, ca=None, **more):
    text = f"etcd://{url.split('//', 1)[1]}/job1?protocol=https"
    if certificates:
        text += f"&cacert={ca or certificates.ca}"
    if client:
        text += f"&cert={client[0]}&key={client[1]}"
    return etcd.parse(text + "".join(f"&{k}={v}" for k, v in more.items()), {})


def test_agents_with_the_jobs_certificate_form_a_round_and_finish(tls_etcd):
    url, certificates = tls_etcd
    a = rendezvous.Rendezvous(_endpoint(url, certificates, certificates.client), "job1", "a-1", "127.0.0.1", 1)
    b = rendezvous.Rendezvous(etcd.parse("etcd://" + url.split("//", 1)[1] + "/job1", {
        "TFGPU_ETCD_CACERT": certificates.ca, "TFGPU_ETCD_CERT": certificates.client[0],
        "TFGPU_ETCD_KEY": certificates.client[1]}), "job1", "b-1", "127.0.0.1", 1)
    a.register()
    b.register()
    try:
        current, won = a.propose(None, sorted(a.alive()), 0, "first")
        assert won and current.members == ("a-1", "b-1")
        a.publish(1, [1111])
        b.publish(1, [2222])
        assert rendezvous.wait_for_members(b, current, timeout_s=5)["a-1"]["ports"] == [1111]
        a.mark_done(1)
        assert b.done(1)
    finally:
        a.leave()
        b.leave()


def test_a_client_etcd_does_not_trust_is_refused_in_one_line_naming_the_option(tls_etcd, tmp_path):
    url, certificates = tls_etcd
    other = make_certificates(tmp_path / "other", name="other")
    refused = {
        "no client certificate": (_endpoint(url, certificates), r"TLS: etcd refused this client \(no client "
                                  r"certificate; .*\): set cert= and key= .* --trusted-ca-file$"),
        "another CA's certificate": (_endpoint(url, certificates, other.client),
                                     r"TLS: etcd refused this client \(cert=.*other/client.pem; .*\): set cert= and "
                                     r"key="),
        "another CA expected": (_endpoint(url, certificates, certificates.client, ca=other.ca),
                                r"TLS: etcd's certificate is not signed by cacert=.*other/ca.pem \(unable to get "
                                r"local issuer certificate\): set cacert= \(or TFGPU_ETCD_CACERT\)"),
        "plain http": (etcd.parse("etcd://" + url.split("//", 1)[1] + "/job1", {}),
                       r"closed the connection .*: if it serves TLS \(--cert-file\), add "
                       r"\?protocol=https&cacert=CA.pem&cert=CERT.pem&key=KEY.pem to --rendezvous"),
    }
    for case, (endpoint, line) in refused.items():
        with pytest.raises(rendezvous.RendezvousError, match=f"^etcd at .*{line}") as e:
            rendezvous.Rendezvous(endpoint, "job1", "x-1", "127.0.0.1", 1).register()
        assert "\n" not in str(e.value), case


def test_an_etcd_whose_certificate_names_another_host_is_one_line(tmp_path):
    require_etcd()
    certificates = make_certificates(tmp_path / "pki", server_names="DNS:etcd.example")
    proc, url = start_etcd(tmp_path / "etcd", tls=certificates)
    try:
        with pytest.raises(rendezvous.RendezvousError, match=r"TLS: etcd's certificate is not valid for 127.0.0.1 "
                           r"\(IP address mismatch.*\): name etcd in --rendezvous as its certificate does"):
            etcd.Etcd(_endpoint(url, certificates, certificates.client)).get("/x")
    finally:
        stop_etcd(proc)


def test_the_launcher_refused_by_etcd_exits_1_with_the_line(tls_etcd, capsys):
    url, _ = tls_etcd
    endpoint = "etcd://" + url.split("//", 1)[1] + "/job1"
    assert launch.main(["--num_workers=2", f"--rendezvous={endpoint}", "--", "true"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "if it serves TLS (--cert-file), add ?protocol=https" in err


@pytest.fixture
def auth_etcd(tmp_path):
    """The URL of an etcd with auth enabled, whose tokens expire after 2 s: user ``agent`` (password ``pw``) may
    read and write /tfgpu/job1/ only."""
    require_etcd()
    proc, url = start_etcd(tmp_path / "etcd", flags=("--auth-token-ttl", "2"))
    try:
        call, prefix = etcd.Etcd(url).call, "/tfgpu/job1/"
        call("/v3/auth/user/add", {"name": "root", "password": "rootpw"})
        call("/v3/auth/user/grant", {"user": "root", "role": "root"})
        call("/v3/auth/role/add", {"name": "job1"})
        call("/v3/auth/role/grant", {"name": "job1", "perm": {
            "permType": "READWRITE", "key": etcd.b64(prefix), "range_end": etcd.prefix_end(prefix)}})
        call("/v3/auth/user/add", {"name": "agent", "password": "pw"})
        call("/v3/auth/user/grant", {"user": "agent", "role": "job1"})
        call("/v3/auth/enable", {})
        yield url
    finally:
        stop_etcd(proc)


def test_a_user_of_the_jobs_role_works_past_its_tokens_expiry(auth_etcd):
    text = f"etcd://{auth_etcd.split('//', 1)[1]}/job1?user=agent"
    a = rendezvous.Rendezvous(etcd.parse(text, {"TFGPU_ETCD_PASSWORD": "pw"}), "job1", "a-1", "127.0.0.1", 1)
    a.register()
    try:
        first = a.etcd._token
        time.sleep(3)  # past --auth-token-ttl=2: etcd has forgotten the token
        current, won = a.propose(None, ("a-1",), 0, "first")
        assert won and current.number == 1 and a.etcd._token != first
        with pytest.raises(rendezvous.RendezvousError, match=r"permission denied \(user 'agent' needs a role "
                                                             r"granting readwrite on /tfgpu/job1/\)"):
            a.etcd.put("/tfgpu/job2/round", "{}")
    finally:
        a.leave()
    with pytest.raises(rendezvous.RendezvousError, match=r"refused user 'agent' .*invalid user ID or password"):
        rendezvous.Rendezvous(etcd.parse(text, {"TFGPU_ETCD_PASSWORD": "wrong"}), "job1", "b-1", "x", 1).register()
    with pytest.raises(rendezvous.RendezvousError, match=r"user name is empty \(etcd has auth enabled: set user= or "
                                                         r"TFGPU_ETCD_USER, and TFGPU_ETCD_PASSWORD\)"):
        rendezvous.Rendezvous(auth_etcd, "job1", "b-1", "x", 1).register()
