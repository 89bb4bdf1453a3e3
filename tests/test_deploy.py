"""deploy/: the nightly on a real GPU cluster (docs/deploy.md), checked
without a cluster. Every Kubernetes manifest under deploy/ (and the RayJob
the fallback CronJob creates) validates against its schema with unknown
fields refused: KubeRay's CRD schemas (from the steering repo's shared/,
skipped where missing) and a strict hand-written subset for the core kinds
(deploy/schemas/README.md).
Then their structure: the job command is one this checkout accepts, writes
where the head mounts the volume the site server reads, as the image's
user, alerts through a webhook from a Secret, asks Ray for the GPUs the
pods request, and names the Ray of pyproject.toml; the CronJob fallback
creates the RayCronJob's own RayJob; the `ray up` config syncs and sets up
this checkout with token authentication, and its cron script submits a
nightly command this checkout accepts as a Ray job."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path, PurePosixPath

import jsonschema
import pytest

from jobs.__main__ import _parse_job

yaml = pytest.importorskip("yaml", reason="PyYAML comes with ray[default]")

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
KUBERAY = DEPLOY / "kuberay"
SCHEMAS = DEPLOY / "schemas"
CRD_DIR = Path(os.environ.get("LAMPORT_KUBERAY_CRDS", REPO.parent / "shared" / "kuberay-crds"
                              / "v1.7.0"))
"""KubeRay v1.7.0's CRD schemas (deploy/schemas/README.md): public material
kept only in the steering repo's shared/ (beside every checkout and CI's
clone), never in this repo."""
CRDS = {"ray.io/v1/RayJob": "ray.io_rayjobs.v1.json",
        "ray.io/v1/RayCronJob": "ray.io_raycronjobs.v1.json"}
CRON = re.compile(r"^(\S+\s+){4}\S+$")
NOTIFY_ENV = "LAMPORT_NOTIFY_URL"
# A night's Job as the CronJob controller names it (<cronjob>-<minutes since
# the epoch>) and its uid: what the fallback's pod writes into the RayJob.
SAMPLE_NIGHT = {"@JOB_NAME@": "lamport-nightly-29412345",
                "@JOB_UID@": "0f9c6a2e-4b1d-4d6b-9a4e-3c2b1a5e7d90"}
MAX_RAYJOB_NAME = 47  # KubeRay 1.7 utils.MaxRayJobNameLength (its RayCluster's 53 - 6)


def _load_all(path: Path) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text()) if doc}


def _notify_env_known() -> bool:
    """Whether this checkout's nightly takes ``--notify-env VAR`` (jobs.alerts;
    added beside this deploy/ change, on another branch)."""
    return _parse_job(["nightly", "--notify-env", NOTIFY_ENV]) is not None


def _job(command: str):
    """The job command after ``python -m jobs``, as the job will parse it.
    Until ``--notify-env`` is in this checkout's CLI, the command is parsed
    without it (and it must name NOTIFY_ENV)."""
    words = shlex.split(command)
    start = words.index("jobs") + 1
    assert words[start - 2:start] == ["-m", "jobs"], command
    words = words[start:]
    if "--notify-env" in words and not _notify_env_known():
        at = words.index("--notify-env")
        assert words[at + 1] == NOTIFY_ENV, command
        del words[at:at + 2]
    job = _parse_job(words)
    assert job is not None, f"the job command does not parse: {command}"
    return job


# -- the schema check ---------------------------------------------------------

def _strict(schema):
    """``schema`` with every object that leaves its fields open
    (no additionalProperties, no x-kubernetes-preserve-unknown-fields)
    closed: an unknown field is an error, as ``kubectl apply``'s strict
    field validation makes it (instead of the API server dropping it)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in ("properties", "$defs"):
        if key in out:
            out[key] = {name: _strict(sub) for name, sub in out[key].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = _strict(out[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [_strict(sub) for sub in out[key]]
    if ((out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _have_crds() -> bool:
    return all((CRD_DIR / name).is_file() for name in CRDS.values())


NO_CRDS = (f"KubeRay's CRD schemas are not in {CRD_DIR} (deploy/schemas/README.md says "
           f"what goes there); RayJob, RayCronJob and pod templates go unchecked")
needs_crds = pytest.mark.skipif(not _have_crds(), reason=NO_CRDS)


@functools.cache
def _validators() -> dict[str, jsonschema.protocols.Validator]:
    """A strict validator per ``apiVersion/kind``: KubeRay's CRD
    schemas and deploy/schemas/core.yaml, each object's metadata checked as
    core.yaml's ObjectMeta, pods as the CRDs' PodTemplateSpec."""
    core = yaml.safe_load((SCHEMAS / "core.yaml").read_text())
    if _have_crds():
        crds = {kind: json.loads((CRD_DIR / name).read_text()) for kind, name in CRDS.items()}
        cluster = crds["ray.io/v1/RayJob"]["properties"]["spec"]["properties"]["rayClusterSpec"]
        pods = cluster["properties"]["headGroupSpec"]["properties"]["template"]
    else:  # pods unchecked (open), the KubeRay kinds skipped (NO_CRDS)
        crds, pods = {}, {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    defs = {**core["$defs"], "PodTemplateSpec": pods}
    validators = {}
    for kind, schema in {**core["kinds"], **crds}.items():
        group_version, name = kind.rsplit("/", 1)
        properties = {key: sub for key, sub in schema["properties"].items() if key != "status"}
        properties.update(apiVersion={"const": group_version}, kind={"const": name},
                          metadata={"$ref": "#/$defs/ObjectMeta"})
        whole = {**schema, "type": "object", "properties": properties, "$defs": defs,
                 "required": sorted({"apiVersion", "kind", "metadata",
                                     *schema.get("required", ())})}
        validators[kind] = jsonschema.Draft202012Validator(_strict(whole))
    return validators


def _errors(doc: dict) -> list[str]:
    """Why ``doc`` is not a valid object of its kind, one line each
    (``path: message``); [] when it is."""
    kind = f"{doc.get('apiVersion')}/{doc.get('kind')}"
    validator = _validators().get(kind)
    if validator is None:
        return [f"no schema for {kind} (deploy/schemas/README.md: add one)"]
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:300]}"
                  for e in validator.iter_errors(doc))


def _rendered(template: str) -> str:
    """The fallback's RayJob template as the CronJob's pod writes it for
    SAMPLE_NIGHT."""
    for placeholder, value in SAMPLE_NIGHT.items():
        template = template.replace(placeholder, value)
    return template


def _manifests() -> dict[str, dict]:
    """Every Kubernetes object under deploy/ (a YAML document with a kind;
    deploy/ray-up's config is none), keyed ``file[index] Kind``, and every
    manifest a ConfigMap there carries (``file[index] ConfigMap key``)."""
    found = {}
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if SCHEMAS in path.parents:
            continue
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if not isinstance(doc, dict) or "kind" not in doc:
                continue
            where = f"{path.relative_to(DEPLOY)}[{index}]"
            found[f"{where} {doc['kind']}"] = doc
            if doc["kind"] == "ConfigMap":
                for key, text in doc.get("data", {}).items():
                    if key.endswith(".yaml"):
                        found[f"{where} ConfigMap {key}"] = yaml.safe_load(_rendered(text))
    return found


def test_every_manifest_under_deploy_matches_its_schema_unknown_fields_refused():
    manifests = _manifests()
    for path in KUBERAY.glob("*.yaml"):  # no file there escapes the check
        assert any(key.startswith(f"kuberay/{path.name}[") for key in manifests), path
    kinds = {f"{doc['apiVersion']}/{doc['kind']}" for doc in manifests.values()}
    assert {"ray.io/v1/RayCronJob", "ray.io/v1/RayJob", "batch/v1/CronJob",
            "networking.k8s.io/v1/Ingress"} <= kinds
    if not _have_crds():
        manifests = {k: d for k, d in manifests.items()
                     if f"{d['apiVersion']}/{d['kind']}" not in CRDS}
    bad = {key: errors for key, doc in manifests.items() if (errors := _errors(doc))}
    assert not bad, "\n".join(f"{key}: {line}" for key, errors in bad.items() for line in errors)


def _plant(doc: dict, path: str, wrong: str) -> dict:
    """A copy of ``doc`` with the field at ``path`` (dotted; numbers index
    lists) renamed to ``wrong``."""
    doc = copy.deepcopy(doc)
    *parents, key = path.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[wrong] = node.pop(key)
    return doc


@pytest.mark.parametrize("file,kind,path,wrong", [
    ("nightly.yaml", "RayCronJob", "spec.jobTemplate.entrypoint", "entrypont"),
    ("nightly.yaml", "RayCronJob", "spec.timeZone", "timezone"),
    ("nightly.yaml", "RayCronJob",
     "spec.jobTemplate.rayClusterSpec.headGroupSpec.template.spec.securityContext.fsGroup",
     "fsgroup"),
    ("nightly.yaml", "RayCronJob",
     "spec.jobTemplate.rayClusterSpec.workerGroupSpecs.0.template.spec.containers.0.volumeMounts",
     "volumeMount"),
    ("nightly-cronjob.yaml", "CronJob", "spec.timeZone", "timezone"),
    ("nightly-cronjob.yaml", "CronJob", "spec.jobTemplate.spec.template.spec.serviceAccountName",
     "serviceAccount_name"),
    ("nightly-cronjob.yaml", "Role", "rules.0.verbs", "verb"),
    ("site.yaml", "Deployment", "spec.template.metadata.labels", "label"),
    ("site-ingress.yaml", "Ingress", "spec.ingressClassName", "ingressClass"),
    ("site.yaml", "PersistentVolumeClaim", "spec.storageClassName", "storageClass"),
])
def test_a_planted_wrong_field_fails_the_check(file, kind, path, wrong):
    if not _have_crds() and (kind.startswith("Ray") or ".template." in f".{path}."):
        pytest.skip(NO_CRDS)
    doc = _load_all(KUBERAY / file)[kind]
    assert not _errors(doc)
    errors = _errors(_plant(doc, path, wrong))
    assert any(f"'{wrong}' was unexpected" in line for line in errors), errors


@needs_crds
def test_the_fallbacks_planted_rayjob_field_fails_the_check():
    (cm,) = [doc for doc in yaml.safe_load_all((KUBERAY / "nightly-cronjob.yaml").read_text())
             if doc["kind"] == "ConfigMap"]
    rayjob = yaml.safe_load(_rendered(cm["data"]["rayjob.yaml"]))
    assert not _errors(rayjob)
    errors = _errors(_plant(rayjob, "spec.entrypoint", "entrypont"))
    assert errors == ["spec: Additional properties are not allowed ('entrypont' was unexpected)"]


@needs_crds
def test_the_crd_schemas_are_the_ones_the_readme_names():
    readme = (SCHEMAS / "README.md").read_text()
    assert "v1.7.0" in readme and "59d663aeec13760646da3db9c1cf8cfe883e30b7" in readme
    for name in CRDS.values():
        digest = hashlib.sha256((CRD_DIR / name).read_bytes()).hexdigest()
        assert f"{digest}  {name}" in readme, f"{name}: sha256 {digest} is not in the README"


# -- structure ----------------------------------------------------------------


def _ray_pin() -> tuple[int, int]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray,) = [d for d in deps if d.startswith("ray")]
    low = re.search(r">=(\d+)\.(\d+)", ray)
    return int(low.group(1)), int(low.group(2))


def _mounts(container: dict) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def _claims(pod_spec: dict) -> dict[str, str]:
    return {v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod_spec.get("volumes", []) if "persistentVolumeClaim" in v}


def test_kuberay_nightly_runs_this_checkouts_nightly_on_gpu_workers():
    docs = _load_all(DEPLOY / "kuberay" / "nightly.yaml")
    cron = docs["RayCronJob"]
    assert cron["apiVersion"] == "ray.io/v1"
    assert len(cron["metadata"]["name"]) <= MAX_RAYJOB_NAME - 11  # KubeRay's RayCronJob bound
    assert CRON.match(cron["spec"]["schedule"]), cron["spec"]["schedule"]
    assert cron["spec"]["timeZone"]  # not the KubeRay controller's zone
    spec = cron["spec"]["jobTemplate"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["activeDeadlineSeconds"] > 0
    job = _job(spec["entrypoint"])
    assert (job.cmd, job.backend, job.trigger, job.no_results) == ("nightly", "gpu", "nightly",
                                                                   False)
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    (head_container,) = head["containers"]
    # The driver runs on the head: its rows and site go to the volume mounted there.
    claims, mounts = _claims(head), _mounts(head_container)
    (volume,) = [v for v in mounts if v in claims]
    for path in (job.results, job.site):
        assert path.is_absolute() and PurePosixPath(path).is_relative_to(mounts[volume]), path
    assert cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    # It writes the volume as the image's user; a red night is posted to the
    # webhook whose URL the head (the driver's environment) has from a Secret.
    user, group = re.search(r"^USER (\d+):(\d+)$", (DEPLOY / "Dockerfile").read_text(),
                            re.M).groups()
    context = head["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == \
        (int(user), int(group), int(group))
    words = shlex.split(spec["entrypoint"])
    assert "--notify" not in words and words[words.index("--notify-env") + 1] == NOTIFY_ENV
    (secret,) = [e["valueFrom"]["secretKeyRef"] for e in head_container["env"]
                 if e["name"] == NOTIFY_ENV]
    assert secret["name"] and secret["key"] and not secret.get("optional")
    major, minor = _ray_pin()
    version = tuple(int(x) for x in cluster["rayVersion"].split("."))
    assert version[:2] >= (major, minor) and version[0] == major, cluster["rayVersion"]
    images = {head_container["image"]}
    for group in cluster["workerGroupSpecs"]:
        (worker,) = group["template"]["spec"]["containers"]
        images.add(worker["image"])
        gpus = worker["resources"]["limits"]["nvidia.com/gpu"]
        assert gpus == worker["resources"]["requests"]["nvidia.com/gpu"] >= 1
        assert int(group["rayStartParams"]["num-gpus"]) == gpus  # Ray's count = the pod's
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        assert _mounts(worker).get("dshm") == "/dev/shm"
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in \
            group["template"]["spec"]["volumes"]
    assert len(images) == 1  # one image: the driver's code is the workers' code
    # The site server reads the same claim the head writes, the whole volume.
    site = _load_all(DEPLOY / "kuberay" / "site.yaml")
    assert site["PersistentVolumeClaim"]["metadata"]["name"] == claims[volume]
    assert "ReadWriteMany" in site["PersistentVolumeClaim"]["spec"]["accessModes"]
    pod = site["Deployment"]["spec"]["template"]["spec"]
    (nginx,) = pod["containers"]
    (served,) = [m for m in nginx["volumeMounts"] if _claims(pod).get(m["name"]) == claims[volume]]
    assert served.get("readOnly") is True and "subPath" not in served
    assert site["Service"]["spec"]["selector"] == pod_labels(site["Deployment"])
    # The Ingress example publishes that Service.
    ingress = _load_all(KUBERAY / "site-ingress.yaml")["Ingress"]
    backends = [p["backend"]["service"] for rule in ingress["spec"]["rules"]
                for p in rule["http"]["paths"]]
    assert backends == [{"name": site["Service"]["metadata"]["name"],
                         "port": {"number": site["Service"]["spec"]["ports"][0]["port"]}}]


def test_the_cronjob_fallback_creates_the_raycronjobs_rayjob_each_night(tmp_path):
    cron = _load_all(KUBERAY / "nightly.yaml")["RayCronJob"]
    docs = _load_all(KUBERAY / "nightly-cronjob.yaml")
    cronjob = docs["CronJob"]
    assert cronjob["apiVersion"] == "batch/v1"
    for key in ("schedule", "timeZone"):  # the same nights as the RayCronJob
        assert cronjob["spec"][key] == cron["spec"][key]
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    template = docs["ConfigMap"]["data"]["rayjob.yaml"]
    rayjob = yaml.safe_load(_rendered(template))
    assert (rayjob["apiVersion"], rayjob["kind"]) == ("ray.io/v1", "RayJob")
    assert rayjob["spec"] == cron["spec"]["jobTemplate"]
    # One RayJob per night, named and owned by the night's Job: unique, and
    # deleted with it when the CronJob's history drops the Job.
    assert rayjob["metadata"]["name"] == SAMPLE_NIGHT["@JOB_NAME@"]
    assert rayjob["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": SAMPLE_NIGHT["@JOB_NAME@"],
         "uid": SAMPLE_NIGHT["@JOB_UID@"]}]
    assert len(cronjob["metadata"]["name"]) + len("-29412345") <= MAX_RAYJOB_NAME
    # The pod fills in the template's placeholders from its Job's labels: its
    # script, run here (mount paths under tmp_path), writes _rendered's RayJob.
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (render,), (create,) = pod["initContainers"], pod["containers"]
    assert render["command"][:2] == ["sh", "-c"]
    script = render["command"][2]
    assert set(re.findall(r"@[A-Z_]+@", template)) == set(SAMPLE_NIGHT)
    labels = {"JOB_NAME": ("batch.kubernetes.io/job-name", SAMPLE_NIGHT["@JOB_NAME@"]),
              "JOB_UID": ("batch.kubernetes.io/controller-uid", SAMPLE_NIGHT["@JOB_UID@"])}
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in render["env"]}
    assert env == {name: f"metadata.labels['{label}']" for name, (label, _) in labels.items()}
    mounts = {m["mountPath"]: m["name"] for m in render["volumeMounts"]}
    here = script
    for path in mounts:
        (tmp_path / path.strip("/")).mkdir(parents=True)
        here = here.replace(path, str(tmp_path / path.strip("/")))
    (source, target) = re.search(r"(\S+/rayjob\.yaml) > (\S+)$", script).groups()
    (tmp_path / source.strip("/")).write_text(template)
    subprocess.run(["sh", "-c", here], check=True, timeout=30,
                   env={"PATH": os.environ["PATH"],
                        **{name: value for name, (_, value) in labels.items()}})
    assert (tmp_path / target.strip("/")).read_text() == _rendered(template)
    # ... reading the ConfigMap's template, writing the file kubectl applies.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[str(PurePosixPath(source).parent)]]["configMap"]["name"] == \
        docs["ConfigMap"]["metadata"]["name"]
    assert create["command"] == ["kubectl", "apply", "-f", target]
    assert {m["name"] for m in create["volumeMounts"]} == {mounts[str(PurePosixPath(target).parent)]}
    # As a ServiceAccount that may get, create and patch (kubectl apply) RayJobs, only.
    account = pod["serviceAccountName"]
    assert docs["ServiceAccount"]["metadata"]["name"] == account
    assert docs["Role"]["rules"] == [{"apiGroups": ["ray.io"], "resources": ["rayjobs"],
                                      "verbs": ["get", "create", "patch"]}]
    binding = docs["RoleBinding"]
    assert binding["roleRef"]["name"] == docs["Role"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]


def pod_labels(deployment: dict) -> dict:
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_the_image_sets_up_this_checkout_with_cuda_torch_and_its_commit():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^RUN .*LAMPORT_TORCH=\S*torch.* scripts/setup$", text, re.M)
    assert "LAMPORT_GIT_COMMIT=${GIT_COMMIT}" in text
    setup = (REPO / "scripts" / "setup").read_text()
    assert "LAMPORT_TORCH" in setup and "LAMPORT_VENV" in setup
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)


def test_ray_up_config_syncs_this_checkout_and_starts_ray_with_token_auth():
    config = yaml.safe_load((DEPLOY / "ray-up" / "cluster.yaml").read_text())
    assert config["provider"]["type"] == "local"
    assert config["provider"]["head_ip"] and len(config["provider"]["worker_ips"]) == \
        config["max_workers"]
    assert config["file_mounts"]["~/lamport-lab"] == "."
    assert "~/.ray/auth_token" in config["file_mounts"]  # Ray's default token file
    assert any(c.endswith("scripts/setup") for c in config["setup_commands"])
    head = " ".join(config["head_start_ray_commands"])
    workers = " ".join(config["worker_start_ray_commands"])
    assert "ray start --head" in head and "--num-gpus=0" in head
    assert "--address=$RAY_HEAD_IP:6379" in workers
    for starts in (config["head_start_ray_commands"], config["worker_start_ray_commands"]):
        assert [c for c in starts if " start " in c and "RAY_AUTH_MODE=token" in c]


def test_ray_up_cron_script_submits_a_nightly_this_checkout_accepts_as_a_ray_job():
    script = (DEPLOY / "ray-up" / "nightly.sh").read_text()
    assert (DEPLOY / "ray-up" / "nightly.sh").stat().st_mode & 0o111
    # Submitted to the head's job server (it outlives the ssh session), not run under ray exec.
    (jobs,) = re.findall(r"^jobs='([^']+)'$", script, re.M)
    (server,) = re.findall(r"^server='([^']+)'$", script, re.M)
    (submit,) = re.findall(r'^on_head "\$jobs submit \$server ([^"]+)"', script, re.M)
    assert shlex.split(jobs) == [".venv/bin/python", "-m", "jobs"]
    words = shlex.split(f"submit {server} {submit}".replace("\\$HOME", "/home/lamport"))
    args = _parse_job(words)
    assert args is not None and args.cmd == "submit" and args.no_wait, submit
    assert args.address == "http://127.0.0.1:8265"  # the dashboard of cluster.yaml's head
    assert args.submission_id == "$job_id"  # this night's id, filled in by the script
    job = _job(" ".join(["python", "-m", "jobs", *args.command[1:]]))
    assert (job.cmd, job.backend, job.trigger) == ("nightly", "gpu", "nightly")
    assert job.results.is_absolute() and job.site.is_absolute()
    assert "rsync-down" in script and "~/lamport-data/site/" in script  # the site it builds
    assert str(job.site).replace("/home/lamport", "~") == "~/lamport-data/site"
    # Followed to its end, then its exit status asked of the job server.
    assert '"$jobs logs $job_id $server --follow"' in script
    assert '"$jobs status $job_id $server; echo \\"nightly.sh: exit status \\$?\\""' in script


FAKE_RAY = r"""#!/usr/bin/env bash
# `ray` for nightly.sh without a cluster: `exec` runs the command in a login
# shell of the "head" ($FAKE_HEAD as HOME), and, like Ray's, exits 1 for any
# failure of it; every call is logged.
echo "ray $*" >> "$FAKE_LOG"
case "$1" in
  up) exit 0 ;;
  exec) HOME=$FAKE_HEAD bash -c "$3" || exit 1 ;;
  rsync-down) mkdir -p "$4" ;;
  *) exit 2 ;;
esac
"""
FAKE_PYTHON = r"""#!/usr/bin/env bash
# The head's `python -m jobs`: records the command; `logs` fails the first
# $FAKE_LOGS_FAIL times (a dropped ssh session); `status` exits $FAKE_STATUS.
echo "python $*" >> "$FAKE_LOG"
case "$3" in
  submit) echo "submit: job taken" ;;
  logs) n=$(grep -c '^python -m jobs logs ' "$FAKE_LOG"); [ "$n" -gt "${FAKE_LOGS_FAIL:-0}" ] || exit 1 ;;
  status) printf "Status for job: done\r\n"; exit "$FAKE_STATUS" ;;
esac
"""


def _run_nightly_sh(tmp_path: Path, status: int, logs_fail: int = 0):
    """deploy/ray-up/nightly.sh run against FAKE_RAY: its exit status and
    the calls it made."""
    root, head = tmp_path / "repo", tmp_path / "head"
    (root / "deploy" / "ray-up").mkdir(parents=True)
    script = root / "deploy" / "ray-up" / "nightly.sh"
    script.write_text((DEPLOY / "ray-up" / "nightly.sh").read_text())
    for path, text in ((root / ".venv" / "bin" / "ray", FAKE_RAY),
                       (head / "lamport-lab" / ".venv" / "bin" / "python", FAKE_PYTHON)):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    for path in (script, root / ".venv/bin/ray", head / "lamport-lab/.venv/bin/python"):
        path.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**os.environ, "FAKE_LOG": str(log), "FAKE_HEAD": str(head),
           "FAKE_STATUS": str(status), "FAKE_LOGS_FAIL": str(logs_fail),
           "LAMPORT_SITE_DIR": str(tmp_path / "www"), "LAMPORT_NIGHTLY_RETRY_S": "0",
           "LAMPORT_NIGHTLY_JOB_ID": "lamport-nightly-20261208T020000Z"}
    done = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, log.read_text().splitlines()


@pytest.mark.parametrize("status", [0, 1, 3])
def test_ray_up_cron_script_exits_with_the_submitted_jobs_status(tmp_path, status):
    code, calls = _run_nightly_sh(tmp_path, status)
    assert code == status, calls
    python = [c.split(" ", 4)[3:] for c in calls if c.startswith("python ")]
    assert [p[0] for p in python] == ["submit", "logs", "status"]
    submit = shlex.split(python[0][1])
    job = submit.index("--submission-id") + 1
    assert submit[job] == "lamport-nightly-20261208T020000Z"
    # $HOME is the head's: the job's outputs are absolute paths there.
    assert f"{tmp_path}/head/lamport-data/results" in submit
    assert calls[-1].startswith("ray rsync-down ")


def test_ray_up_cron_script_follows_again_when_the_session_drops(tmp_path):
    code, calls = _run_nightly_sh(tmp_path, status=1, logs_fail=2)
    assert code == 1
    assert [c.split()[3] for c in calls if c.startswith("python ")] == \
        ["submit", "logs", "logs", "logs", "status"]
