"""deploy/ is deployable as written: each target checked offline by a validator installed from a
package (no container engine or cluster runs here), plus what a schema cannot know: the commands
are real toolproxy commands with flags that exist, the pieces agree with each other (ports, volume,
user, secrets), and the image's health check answers against a real proxy.

- Dockerfile: hadolint, and its instructions parsed by dockerfile-parse.
- compose.yaml: the Compose specification's schema as check-jsonschema ships it.
- kubernetes/*.yaml: kubernetes-validate --strict (the Kubernetes API's schemas it ships).
- toolproxy.service: systemd-analyze verify.
Each validator is also shown a broken copy, so a validator that accepts anything fails the test.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import click
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from toolproxy.cli import main
from toolproxy.emulators import text

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
REPO = DEPLOY.parent
K8S = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
HEALTH_SCRIPT = "/opt/toolproxy/healthcheck.py"
BIN = Path(sys.executable).parent


def run(*cmd: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)


def tool(name: str) -> str:
    """A validator installed with the test extra, next to this Python (never a stray copy on PATH)."""
    path = shutil.which(name, path=str(BIN))
    if path is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return path


def check_invocation(argv: list[str]) -> None:
    """argv (`toolproxy CMD ...`) is a real command whose flags exist and whose values parse."""
    assert argv[0] == "toolproxy", argv
    name, args = argv[1], argv[2:]
    with click.Context(main) as ctx:
        cmd = main.get_command(ctx, name)
    assert cmd is not None, f"toolproxy has no command {name!r}"
    env = {**os.environ, "TOOLPROXY_UPSTREAM": "http://127.0.0.1:9"}  # set by the deployment, not the args
    old = os.environ.copy()
    os.environ.update(env)
    try:
        cmd.make_context(name, list(args))
    except click.ClickException as exc:
        pytest.fail(f"`{shlex.join(argv)}`: {exc.format_message()}")
    finally:
        os.environ.clear()
        os.environ.update(old)


def shell_invocations(script: str) -> list[list[str]]:
    """Every `toolproxy ...` command in a shell script, cut at && ; || | and line ends."""
    out = []
    for line in script.splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        current: list[str] | None = None
        for token in list(lex) + [";"]:
            if token in ("&&", ";", "||", "|", "&"):
                if current:
                    out.append(current)
                current = None
            elif current is not None:
                current.append(token)
            elif token == "toolproxy" or token.endswith("/toolproxy"):
                current = ["toolproxy"]
    return out


def option_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# ---------------------------------------------------------------- Dockerfile


@pytest.fixture(scope="module")
def dockerfile():
    return DockerfileParser(path=str(DEPLOY / "Dockerfile"))


def final_stage(df: DockerfileParser) -> list[dict]:
    froms = [i for i, ins in enumerate(df.structure) if ins["instruction"] == "FROM"]
    assert len(froms) == 2, "a build stage and a runtime stage"
    return df.structure[froms[-1] :]


def image_command(df: DockerfileParser) -> list[str]:
    stage = final_stage(df)
    (entry,) = [json.loads(i["value"]) for i in stage if i["instruction"] == "ENTRYPOINT"]
    (cmd,) = [json.loads(i["value"]) for i in stage if i["instruction"] == "CMD"]
    return entry + cmd


def test_dockerfile_passes_hadolint():
    if not (sys.platform == "linux" and platform.machine() == "x86_64"):
        pytest.skip("hadolint ships as a wheel for x86_64 Linux only")
    r = run(tool("hadolint"), DEPLOY / "Dockerfile")
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
    broken = DEPLOY / "Dockerfile"
    text = broken.read_text().replace("USER 10001:10001", "USER root")
    r = subprocess.run([tool("hadolint"), "-"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "DL3002" in r.stdout  # "last USER should not be root"


def test_image_runs_serve_as_a_non_root_user_with_a_data_volume_and_a_health_check(dockerfile):
    stage = final_stage(dockerfile)
    by = {}
    for ins in stage:
        by.setdefault(ins["instruction"], []).append(ins["value"])
    user = by["USER"][-1].split(":")
    assert user[0].isdigit() and int(user[0]) != 0 and int(user[-1]) != 0, by["USER"]
    argv = image_command(dockerfile)
    check_invocation(argv)
    assert argv[1] == "serve" and option_value(argv, "--host") == "0.0.0.0"
    assert json.loads(by["VOLUME"][0]) == [option_value(argv, "--data")]
    port = option_value(argv, "--port")
    assert by["EXPOSE"] == [port]
    assert by["STOPSIGNAL"] == ["SIGTERM"]
    (health,) = by["HEALTHCHECK"]
    assert json.loads(health.split("CMD", 1)[1]) == ["python", HEALTH_SCRIPT]
    assert f"http://127.0.0.1:{port}/_toolproxy/health" in (DEPLOY / "healthcheck.py").read_text()
    # Everything the build copies from the repository is there, and not left out of the context.
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for ins in dockerfile.structure:
        if ins["instruction"] == "COPY" and not ins["value"].startswith("--from"):
            for src in ins["value"].split()[:-1]:
                assert (REPO / src).exists() and f"!{src}" in ignored, src
    assert f"COPY deploy/healthcheck.py {HEALTH_SCRIPT}" in (DEPLOY / "Dockerfile").read_text()


def health(url: str, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TOOLPROXY_AUTH_TOKEN"}
    env["TOOLPROXY_HEALTH_URL"] = url + "/_toolproxy/health"
    if token is not None:
        env["TOOLPROXY_AUTH_TOKEN"] = token
    return subprocess.run(
        [sys.executable, str(DEPLOY / "healthcheck.py"), *args], env=env, capture_output=True, text=True, timeout=30
    )


def test_the_health_script_asks_with_the_token_and_tells_ready_from_alive(fake_stack, proxy):
    """The image's HEALTHCHECK and the pods' probes, against real proxies: one that requires a
    token (as the image's does), whose recording then fails, and which then stops."""
    fake = fake_stack("openai")
    p = proxy(fake.url, "--quiet", "--no-fingerprint", "--no-live-page", "--auth-token", "s3cret")
    assert health(p.url, token="s3cret").returncode == 0
    assert health(p.url, "--alive", token="s3cret").returncode == 0
    r = health(p.url, token="wrong")
    assert r.returncode == 1 and "HTTP 401" in r.stderr
    assert health(p.url, "--bogus", token="s3cret").returncode == 2
    # Degraded: the segment directory turns into a file, so the next record cannot be written and
    # health answers 503: not ready, still alive.
    seg_dir = p.data / "segments"
    shutil.rmtree(seg_dir)
    seg_dir.write_bytes(b"")
    fake.enqueue(text("hi"))
    req = urllib.request.Request(
        p.url + "/v1/chat/completions",
        method="POST",
        headers={"Authorization": "Bearer s3cret", "Content-Type": "application/json"},
        data=json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).encode(),
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    deadline = time.monotonic() + 120
    while (r := health(p.url, token="s3cret")).returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.returncode == 1 and "HTTP 503" in r.stderr
    assert health(p.url, "--alive", token="s3cret").returncode == 0
    p.stop()
    r = health(p.url, "--alive", token="s3cret")
    assert r.returncode == 1 and "does not answer" in r.stderr


# ---------------------------------------------------------------- compose


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_file_matches_the_compose_specification(tmp_path):
    r = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", DEPLOY / "compose.yaml")
    assert r.returncode == 0 and "ok -- validation done" in r.stdout, r.stdout + r.stderr
    broken = tmp_path / "compose.yaml"
    broken.write_text(
        (DEPLOY / "compose.yaml").read_text().replace("restart: unless-stopped", "restarts: unless-stopped", 1)
    )
    r = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", broken)
    assert r.returncode == 1 and "restarts" in r.stdout, r.stdout + r.stderr


def test_compose_replicas_share_one_volume_behind_the_balancer_and_a_job_analyses_and_exports(compose, dockerfile):
    services = compose["services"]
    proxy, lb, job = services["proxy"], services["lb"], services["analyze"]
    for service in (proxy, job):  # both run this repository's image
        build = service["build"]
        assert (DEPLOY / build["context"]).resolve() == REPO and build["dockerfile"] == "deploy/Dockerfile"
        assert service["image"] == proxy["image"] and service["init"] is True
    image_entry = image_command(dockerfile)[:1]
    argv = image_entry + proxy["command"]
    check_invocation(argv)
    assert proxy["deploy"]["replicas"] >= 2 and "ports" not in proxy  # reached through the balancer only
    data = option_value(argv, "--data")
    assert proxy["volumes"] == [f"recordings:{data}"] and f"recordings:{data}" in job["volumes"]
    assert set(compose["volumes"]) >= {"recordings"}
    # Secrets come from the environment of `docker compose up`, required, never written here.
    key_var = option_value(argv, "--upstream-key-env")
    for var in (key_var, "TOOLPROXY_AUTH_TOKEN", "TOOLPROXY_UPSTREAM"):
        assert re.fullmatch(r"\$\{" + var + r":\?[^}]+\}", proxy["environment"][var]), var
    # The balancer's configuration names the proxy service at serve's port.
    (conf,) = [v.split(":")[0] for v in lb["volumes"] if v.endswith("/etc/nginx/nginx.conf:ro")]
    nginx = (DEPLOY / conf).read_text()
    assert re.search(rf"server proxy:{option_value(argv, '--port')}\b", nginx)
    assert "proxy_buffering off;" in nginx and "proxy_request_buffering off;" in nginx
    assert lb["depends_on"]["proxy"]["condition"] == "service_healthy"
    # The job: analyze, then a Parquet export, both real commands.
    assert job["entrypoint"] == ["/bin/sh", "-c"] and job["healthcheck"] == {"disable": True}
    calls = shell_invocations(job["command"][0].replace("$$", "$"))
    for call in calls:
        check_invocation(call)
    assert [c[1] for c in calls] == ["analyze", "export"]
    assert option_value(calls[1], "--format") == "parquet" and option_value(calls[1], "--data") == data


# ---------------------------------------------------------------- Kubernetes


@pytest.fixture(scope="module")
def k8s():
    docs = {}
    for path in K8S:
        for doc in yaml.safe_load_all(path.read_text()):
            docs[doc["kind"]] = doc
    return docs


def test_kubernetes_manifests_match_the_api_schemas(tmp_path):
    """Strict (no unknown fields), for the oldest Kubernetes still common (1.28) and the newest
    the validator ships."""
    for version in (("-k", "1.28.0"), ()):
        r = run(tool("kubernetes-validate"), "--strict", *version, *K8S)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.count(" passed for resource ") == len(K8S), r.stdout
    broken = tmp_path / "deployment.yaml"
    broken.write_text(
        (DEPLOY / "kubernetes" / "deployment.yaml").read_text().replace("readinessProbe:", "readinesProbe:")
    )
    r = run(tool("kubernetes-validate"), "--strict", broken)
    assert r.returncode != 0 and "readinesProbe" in r.stdout + r.stderr


def pod_checks(pod: dict, uid: int, claim: str) -> list[dict]:
    """What every toolproxy pod must have; returns its containers."""
    sc = pod["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == uid and sc["fsGroup"] == sc["runAsGroup"]
    assert pod["automountServiceAccountToken"] is False
    for c in pod["containers"]:
        csc = c["securityContext"]
        assert csc["readOnlyRootFilesystem"] is True and csc["allowPrivilegeEscalation"] is False
        assert csc["capabilities"]["drop"] == ["ALL"]
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["data"] == "/data" and mounts["tmp"] == "/tmp"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim and "emptyDir" in volumes["tmp"]
    return pod["containers"]


def env_refs(container: dict) -> dict[str, tuple[str, str, str]]:
    out = {}
    for e in container["env"]:
        ((kind, ref),) = e["valueFrom"].items()
        out[e["name"]] = (kind, ref.get("name") or "", ref.get("key") or ref.get("fieldPath"))
    return out


def test_kubernetes_pieces_agree_and_commands_are_real(k8s, dockerfile):
    uid = int([i["value"] for i in final_stage(dockerfile) if i["instruction"] == "USER"][-1].split(":")[0])
    config, pvc, dep, svc, cron = (
        k8s["ConfigMap"],
        k8s["PersistentVolumeClaim"],
        k8s["Deployment"],
        k8s["Service"],
        k8s["CronJob"],
    )
    claim = pvc["metadata"]["name"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # replicas on several nodes share it

    assert dep["spec"]["replicas"] >= 2
    pod = dep["spec"]["template"]
    assert (
        dep["spec"]["selector"]["matchLabels"]
        == svc["spec"]["selector"]
        == {k: v for k, v in pod["metadata"]["labels"].items() if k in svc["spec"]["selector"]}
    )
    (c,) = pod_checks(pod["spec"], uid, claim)
    argv = image_command(dockerfile)[:1] + c["args"]
    check_invocation(argv)
    port = int(option_value(argv, "--port"))
    assert c["ports"] == [{"name": "http", "containerPort": port}] and svc["spec"]["ports"][0]["targetPort"] == "http"
    assert c["readinessProbe"]["exec"]["command"] == ["python", HEALTH_SCRIPT]
    assert c["livenessProbe"]["exec"]["command"] == ["python", HEALTH_SCRIPT, "--alive"]
    refs = env_refs(c)
    assert refs[option_value(argv, "--upstream-key-env")][0] == "secretKeyRef"
    assert refs["TOOLPROXY_AUTH_TOKEN"][0] == "secretKeyRef"
    assert refs["TOOLPROXY_REPLICA"] == ("fieldRef", "", "metadata.name")
    for kind, name, key in refs.values():
        if kind == "configMapKeyRef":
            assert name == config["metadata"]["name"] and key in config["data"]

    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job_pod = cron["spec"]["jobTemplate"]["spec"]["template"]
    (c,) = pod_checks(job_pod["spec"], uid, claim)
    assert c["command"] == ["/bin/sh", "-c"]
    calls = shell_invocations(c["args"][0])
    for call in calls:
        check_invocation(call)
    assert [x[1] for x in calls] == ["analyze", "export"] and option_value(calls[1], "--format") == "parquet"
    for kind, name, key in env_refs(c).values():
        assert kind == "configMapKeyRef" and name == config["metadata"]["name"] and key in config["data"]


# ---------------------------------------------------------------- systemd


def test_systemd_unit_verifies_and_runs_a_real_command(tmp_path):
    """systemd-analyze checks that ExecStart is executable: the unit's venv path is swapped for
    this venv's toolproxy, and that is the only change."""
    unit = (DEPLOY / "toolproxy.service").read_text()
    (exec_start,) = re.findall(r"^ExecStart=(.+)$", unit, re.M)
    argv = shlex.split(exec_start)
    assert argv[0].endswith("/bin/toolproxy")
    check_invocation(["toolproxy", *argv[1:]])
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    copy = tmp_path / "toolproxy.service"
    copy.write_text(unit.replace(argv[0], str(BIN / "toolproxy")))
    r = run(analyze, "verify", copy)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    copy.write_text(unit.replace(argv[0], str(BIN / "toolproxy")).replace("ProtectHome=", "ProtectHom="))
    r = run(analyze, "verify", copy)
    assert "Unknown key 'ProtectHom'" in r.stderr
